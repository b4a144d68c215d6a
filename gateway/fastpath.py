"""The two completion routes as a plain ASGI endpoint, ahead of FastAPI's stack.

Measured on the gateway benchmark (one core, a fast upstream), FastAPI's per-request machinery around a
completion — three middleware layers, route matching, the request/response wrapper with its exit stack, and
dependency solving — took about a third of the gateway's CPU. The completion routes need none of it: the body
is raw bytes, the only input is the Authorization header, and every error is already an OpenAI body. So
``GatewayApp`` serves ``POST /v1/chat/completions`` and ``POST /v1/completions`` itself and hands every other
request (and the lifespan) to FastAPI. The routes stay declared in FastAPI's router (``routes_openai``) so the
published OpenAPI document is unchanged; that declaration and this endpoint call the same pipeline.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fastapi import FastAPI
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from gateway import errors
from gateway.core import Gateway
from gateway.middleware import REQUEST_ID_HEADER, new_request_id
from gateway.pipeline import CHAT, TEXT, Endpoint, complete

log = logging.getLogger(__name__)

COMPLETION_ROUTES: Mapping[str, Endpoint] = {CHAT.path: CHAT, TEXT.path: TEXT}
"""Path → endpoint of the routes served here (POST only; other methods reach FastAPI's 405)."""

STATUS_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}


def error_response(gw: Gateway | None, status: int, body: bytes, headers: Mapping[str, str] | None = None) -> Response:
    """An OpenAI error body response, counted in the errors metric by its OpenAI type."""
    if gw is not None:
        kind = STATUS_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
        gw.metrics.child(gw.metrics.errors, kind, str(status)).inc()
    return Response(body, status_code=status, headers=headers, media_type="application/json")


class GatewayApp(FastAPI):
    """FastAPI with the completion routes short-circuited to ``serve_completion`` (see the module docstring)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = COMPLETION_ROUTES.get(scope["path"])
            gw: Gateway | None = getattr(self.state, "gateway", None)  # None until the lifespan has run
            if endpoint is not None and gw is not None:
                await serve_completion(gw, endpoint, scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def _header(scope: Scope, name: bytes) -> str | None:
    """The first request header ``name`` (lower case), decoded as latin-1 like Starlette does."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The request body; 413 beyond ``limit`` bytes (declared or sent), 400 for a bad Content-Length."""
    declared = _header(scope, b"content-length")
    if declared is not None:
        if not declared.isdigit():
            raise errors.InvalidRequest("Content-Length is not a number.")
        if int(declared) > limit:
            raise errors.BodyTooLarge(f"The request body is {declared} bytes; the limit is {limit} bytes.")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise errors.ClientDisconnected("The client closed the connection while sending the body.")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise errors.BodyTooLarge(f"The request body exceeds the limit of {limit} bytes.")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def serve_completion(gw: Gateway, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send) -> None:
    """Authenticate (before reading the body), read the body within its limit, run the pipeline, and answer —
    with the request id header on every response, as ``RequestIdMiddleware`` does for the other routes."""
    started = gw.clock.monotonic()
    request_id = new_request_id()
    scope.setdefault("state", {})["request_id"] = request_id
    id_header = (REQUEST_ID_HEADER.encode(), request_id.encode())

    async def send_with_id(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", []), id_header]
        await send(message)

    try:
        principal = await gw.keys.authenticate(_header(scope, b"authorization"))
        raw = await read_body(scope, receive, gw.settings.max_body_bytes)
        response = await complete(
            gw, principal, raw, endpoint=endpoint, request_id=request_id, started=started, receive=receive
        )
    except errors.GatewayError as exc:
        response = error_response(gw, exc.status, errors.render(exc), exc.headers())
    except Exception as exc:
        log.exception("unhandled error", exc_info=exc)
        response = error_response(gw, 500, errors.error_body("Internal error in the gateway.", type="api_error"))
    await response(scope, receive, send_with_id)
