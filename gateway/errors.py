"""The gateway's one error tree. Each class carries its HTTP status and OpenAI error type; ``error_body``
renders the OpenAI-shaped body and the app registers a single handler for the whole tree."""

from __future__ import annotations

import math

import orjson


class GatewayError(Exception):
    """Base of every error the gateway returns to a client."""

    status: int = 500
    type: str = "api_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def headers(self) -> dict[str, str]:
        return {}


# --------------------------------------------------------------------------------------------------- 4xx
class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class BodyTooLarge(InvalidRequest):
    status = 413
    code = "body_too_large"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class ModelNotAllowed(GatewayError):
    status = 403
    type = "permission_error"
    code = "model_not_allowed"


class NotFound(GatewayError):
    status = 404
    type = "not_found_error"


class ModelNotFound(NotFound):
    type = "invalid_request_error"
    code = "model_not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"


class RateLimited(GatewayError):
    """A tenant limit refused admission; ``limit`` names it (``rpm``, ``tpm``, ``concurrency``, ``budget``)."""

    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str, *, limit: str, retry_after_s: float) -> None:
        super().__init__(message, code=f"{limit}_exceeded")
        self.limit = limit
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"retry-after": str(max(1, math.ceil(self.retry_after_s))), "x-gearshift-limit": self.limit}


class BudgetExceeded(RateLimited):
    type = "insufficient_quota"


class ClientDisconnected(GatewayError):
    """The client went away before the response started (nginx's 499; the client never sees it)."""

    status = 499
    type = "client_disconnected"


# --------------------------------------------------------------------------------------------------- 5xx
class UpstreamFailed(GatewayError):
    """Every worker tried failed before answering."""

    status = 502
    type = "api_error"
    code = "upstream_failed"


class UpstreamTimeout(UpstreamFailed):
    status = 504
    code = "upstream_timeout"


class StoreUnavailable(GatewayError):
    """The shared store is away and the gateway is configured to fail closed."""

    status = 503
    type = "api_error"
    code = "store_unavailable"

    def headers(self) -> dict[str, str]:
        return {"retry-after": "1"}


class NoWorkerAvailable(GatewayError):
    status = 503
    type = "api_error"
    code = "no_worker_available"


def error_body(message: str, *, type: str, param: str | None = None, code: str | None = None) -> bytes:
    """The OpenAI error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


def render(exc: GatewayError) -> bytes:
    return error_body(exc.message, type=exc.type, param=exc.param, code=exc.code)


def sse_error_event(exc: GatewayError) -> bytes:
    """An in-stream error for a failure after the first byte, followed by ``[DONE]``."""
    return b"data: " + render(exc) + b"\n\ndata: [DONE]\n\n"
