"""The gateway's one error tree, mapped to HTTP in one place. Each class carries its HTTP status and OpenAI error
type; ``respond`` renders any of them as the OpenAI-shaped response (``stream_event`` inside a stream that has
already started) and counts it in ``gearshift_gateway_errors_total{type}`` by that type."""

from __future__ import annotations

import math
from collections.abc import Mapping

import orjson
from starlette.responses import Response

from gateway.metrics import GatewayMetrics


class GatewayError(Exception):
    """Base of every error the gateway returns to a client."""

    status: int = 500
    type: str = "api_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self._headers = dict(headers) if headers else {}

    def headers(self) -> dict[str, str]:
        return self._headers


# --------------------------------------------------------------------------------------------------- 4xx
class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class BodyTooLarge(InvalidRequest):
    status = 413
    code = "body_too_large"


class HeadersTooLarge(InvalidRequest):
    """The request head is too large or has too many headers (answered by ``gateway.http.protocol``)."""

    status = 431
    code = "headers_too_large"


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


def from_http_status(status: int, detail: str, headers: Mapping[str, str] | None = None) -> GatewayError:
    """Starlette's own refusals as members of the tree, keeping their status and headers (``Allow``): no such
    route (404) is ``NotFound``, a wrong method (405) ``MethodNotAllowed``, anything else ``InvalidRequest``
    (4xx) or the base class (5xx)."""
    kind: type[GatewayError] = (
        NotFound
        if status == 404
        else MethodNotAllowed
        if status == 405
        else InvalidRequest
        if status < 500
        else GatewayError
    )
    error = kind(detail, headers=headers)
    error.status = status
    return error


def render(exc: GatewayError) -> bytes:
    """The OpenAI error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return orjson.dumps({"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}})


def respond(exc: GatewayError, metrics: GatewayMetrics | None) -> Response:
    """The response for ``exc`` (its status, headers and OpenAI body), counted by its OpenAI error type.
    ``metrics`` is None only for a request that arrives before the app's lifespan has run."""
    if metrics is not None:
        metrics.child(metrics.errors, exc.type).inc()
    return Response(render(exc), status_code=exc.status, headers=exc.headers(), media_type="application/json")


def stream_event(exc: GatewayError, metrics: GatewayMetrics) -> bytes:
    """A failure after the stream started: the error as an event, then ``[DONE]``; counted like ``respond``."""
    metrics.child(metrics.errors, exc.type).inc()
    return b"data: " + render(exc) + b"\n\ndata: [DONE]\n\n"
