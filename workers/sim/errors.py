"""One error tree for the simulated worker's HTTP API, rendered in vLLM's shape in one place.

Body: ``{"error": {"message": …, "type": …, "param": …, "code": <status>}}`` (vLLM's ``ErrorResponse``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from aiohttp import web
from pydantic import ValidationError

log = logging.getLogger(__name__)


class SimApiError(Exception):
    status: ClassVar[int] = 500
    error_type: ClassVar[str] = "InternalServerError"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, self.status, param=self.param)


class BadRequest(SimApiError):
    status = 400
    error_type = "BadRequestError"


class Unauthorized(SimApiError):
    status = 401
    error_type = "AuthenticationError"


class NotFound(SimApiError):
    status = 404
    error_type = "NotFoundError"


class Conflict(SimApiError):
    status = 409
    error_type = "ConflictError"


class Unavailable(SimApiError):
    status = 503
    error_type = "ServiceUnavailableError"


def error_body(message: str, error_type: str, status: int, *, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": status}}


def from_validation_error(err: ValidationError) -> BadRequest:
    """The first validation problem as a 400 naming the field (``max_tokens: Input should be …``)."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or None
    message = f"{loc}: {first['msg']}" if loc else first["msg"]
    return BadRequest(message, param=loc)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Render every failure as vLLM's error JSON: API errors, aiohttp's own 404/405, and unexpected bugs."""
    try:
        return await handler(request)
    except SimApiError as exc:
        return web.json_response(exc.body(), status=exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error_type = "NotFoundError" if exc.status == 404 else "BadRequestError"
        return web.json_response(error_body(exc.reason, error_type, exc.status), status=exc.status)
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        body = error_body("internal error in the simulated worker", "InternalServerError", 500)
        return web.json_response(body, status=500)
