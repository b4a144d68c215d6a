"""The gateway's one error tree, mapped to HTTP in one place. Each class carries its HTTP status and OpenAI error
type; ``respond`` renders any of them as the OpenAI-shaped response (``stream_event`` inside a stream that has
already started) and counts it in ``gearshift_gateway_errors_total{type}`` by that type.

A worker's own error answer becomes a member of the tree here too (``from_worker``), so every answer has one
shape. A worker failure tells the tenant a stable message with the request id; what happened inside (the
worker's id, the exception) is the error's ``detail``, which goes to the log (``respond``) and the trace span,
never to the client."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from http import HTTPStatus

import orjson
from starlette.responses import Response

from gateway.usage.metrics import GatewayMetrics

log = logging.getLogger(__name__)


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
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.detail = detail
        """Internal account of the error (worker ids, exceptions): logged and traced, never sent."""
        if code is not None:
            self.code = code
        self._headers = dict(headers) if headers else {}

    def headers(self) -> dict[str, str]:
        return self._headers


# --------------------------------------------------------------------------------------------------- 4xx
class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class HeaderNotAllowed(InvalidRequest):
    """A ``x-gearshift-*`` request header the tenant's policy does not let it send (``param`` names it)."""

    code = "header_not_allowed"


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


class TenantSuspended(GatewayError):
    """The key is valid and its tenant is suspended (``PATCH /admin/v1/tenants/{id}`` with ``suspended``)."""

    status = 403
    type = "permission_error"
    code = "tenant_suspended"


class Conflict(GatewayError):
    status = 409
    type = "conflict_error"
    code = "already_exists"


class VersionConflict(Conflict):
    """A change was made against a version that is no longer the stored one (the ``version`` field of its body)."""

    code = "version_conflict"


class PreconditionFailed(GatewayError):
    """``If-Match`` names a version that is no longer the stored one."""

    status = 412
    type = "invalid_request_error"
    code = "precondition_failed"


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
class WorkerFailure(GatewayError):
    """A worker failed. The client reads ``summary`` and the request id; the worker's id and the exception are
    the ``detail``."""

    status = 502
    type = "api_error"
    summary = "The upstream worker failed"

    def __init__(self, detail: str, *, request_id: str, summary: str | None = None, param: str | None = None) -> None:
        super().__init__(f"{summary or self.summary}; request id {request_id}.", param=param, detail=detail)


class UpstreamFailed(WorkerFailure):
    """A worker failed: before answering (after every retry), or after its answer began."""

    code = "upstream_failed"


class UpstreamTimeout(UpstreamFailed):
    status = 504
    code = "upstream_timeout"
    summary = "The upstream worker timed out"


class NoWorkerAvailable(GatewayError):
    """No worker can take the request (none healthy, or every one refused): 503 with ``Retry-After``, 10 s unless
    the raiser's ``headers`` say otherwise (``GatewaySettings.no_worker_retry_after_s``)."""

    status = 503
    type = "api_error"
    code = "no_worker_available"

    def headers(self) -> dict[str, str]:
        return {"retry-after": "10", **self._headers}


class StoreUnavailable(GatewayError):
    """The shared store is away and the gateway is configured to fail closed."""

    status = 503
    type = "api_error"
    code = "store_unavailable"

    def headers(self) -> dict[str, str]:
        return {"retry-after": "1"}


class WorkerError(GatewayError):
    """A worker's own error answer (a 4xx, or a 5xx relayed as is), in the gateway's shape."""


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


OPENAI_TYPES = frozenset(
    {"invalid_request_error", "authentication_error", "permission_error", "not_found_error", "conflict_error",
     "unprocessable_entity_error", "rate_limit_error", "insufficient_quota", "api_error", "server_error"}
)  # fmt: skip
"""The ``type`` values of OpenAI's error object (its API reference and the ``openai`` SDK's error classes)."""


_STATUS_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    422: "unprocessable_entity_error",
    429: "rate_limit_error",
}


def _type_for_status(status: int) -> str:
    """The OpenAI error type of an HTTP status."""
    return _STATUS_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def from_worker(status: int, body: bytes) -> WorkerError:
    """A worker's error answer (``status`` ≥ 400) in the gateway's shape: the status and message kept; ``type``
    kept when it is one of OpenAI's, else the one OpenAI gives that status (vLLM sends ``BadRequestError``);
    ``param`` kept when a string; ``code`` a string or None (vLLM's integer code, which repeats the status, is
    dropped). A body that is not an OpenAI error object becomes a plain error of that status."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        error = {"message": f"The worker answered {status} {_phrase(status)}."}
    kind, param, code = error.get("type"), error.get("param"), error.get("code")
    result = WorkerError(
        error["message"],
        param=param if isinstance(param, str) else None,
        code=code if isinstance(code, str) else str(code) if isinstance(code, int) and code != status else None,
    )
    result.status = status
    result.type = kind if kind in OPENAI_TYPES else _type_for_status(status)
    return result


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def render(exc: GatewayError) -> bytes:
    """The OpenAI error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return orjson.dumps({"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}})


def count(exc: GatewayError, metrics: GatewayMetrics) -> None:
    """Log ``exc``'s detail and count it by its OpenAI error type: every error the gateway answers passes here
    once, whatever its shape (a response, a stream's error event, a Responses API ``error`` event)."""
    _note(exc)
    metrics.child(metrics.errors, exc.type).inc()


def respond(exc: GatewayError, metrics: GatewayMetrics | None) -> Response:
    """The response for ``exc`` (its status, headers and OpenAI body), counted by its OpenAI error type.
    ``metrics`` is None only for a request that arrives before the app's lifespan has run."""
    if metrics is not None:
        count(exc, metrics)
    else:
        _note(exc)
    return Response(render(exc), status_code=exc.status, headers=exc.headers(), media_type="application/json")


def stream_event(exc: GatewayError, metrics: GatewayMetrics) -> bytes:
    """A failure after the stream started: the error as an event, then ``[DONE]``; counted like ``respond``."""
    count(exc, metrics)
    return b"data: " + render(exc) + b"\n\ndata: [DONE]\n\n"


# ------------------------------------------------------------------------------------ overload control
class Shed(RateLimited):
    """A sheddable tier's request refused by the overload control (queue full, or its queued time would break
    its TTFT target): 429 with ``x-gearshift-limit: overload``."""

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message, limit="overload", retry_after_s=retry_after_s)


class FleetOverloaded(GatewayError):
    """A non-sheddable request waited in the overload queue up to its TTFT target (or the maximum wait), or
    found the queue full of requests that may not be shed: 503 with ``Retry-After``."""

    status = 503
    type = "api_error"
    code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"retry-after": str(max(1, math.ceil(self.retry_after_s)))}


def _note(exc: GatewayError) -> None:
    """Log what the client is not told (the message names the request id)."""
    if exc.detail is not None:
        log.warning("%s %s", exc.message, exc.detail)
