"""The gateway's one ASGI entry: every request gets its request id here, the two completion routes go straight
to the pipeline, and everything else (and the lifespan) to FastAPI.

Measured on the gateway benchmark (one core, a fast upstream), FastAPI's per-request machinery around a
completion — middleware, route matching, the request/response wrapper with its exit stack, and dependency
solving — took about a third of the gateway's CPU. The completion routes need none of it: the body is raw
bytes, the only input is the Authorization header, and every error is already an OpenAI body. So
``GatewayApp`` serves ``POST /v1/chat/completions``, ``POST /v1/completions`` and ``POST /v1/responses``
itself; their OpenAPI entries come from ``gateway.http.openapi``.

A client's own ``x-request-id`` is not reused: the id keys the request's concurrency slot, so a client must
not be able to make two requests share one.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import Protocol

from fastapi import FastAPI
from starlette.types import Message, Receive, Scope, Send

from gateway import errors
from gateway.http.console.door import ConsoleDoor
from gateway.intake.admin_guard import ADMIN_ID, ADMIN_PREFIX
from gateway.pipeline import complete
from gateway.upstream.endpoints import CHAT, RESPONSES, TEXT, Endpoint
from gateway.wiring import Gateway

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = b"x-request-id"

COMPLETION_ROUTES: Mapping[str, Endpoint] = {CHAT.path: CHAT, TEXT.path: TEXT, RESPONSES.path: RESPONSES}
"""Path → endpoint of the routes served here (POST only; any other method is answered 405)."""
_ALLOW_POST = {"allow": "POST"}


def new_request_id() -> str:
    """``req-`` and 128 random bits. Request ids are not secrets: the ``random`` module's PRNG (seeded from the
    OS) instead of a urandom call per request."""
    return f"req-{random.getrandbits(128):032x}"


class GatewayApp(FastAPI):
    """FastAPI with a request id on every response and the completion routes short-circuited to
    ``serve_completion`` (see the module docstring)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        request_id = new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        id_header = (REQUEST_ID_HEADER, request_id.encode())
        endpoint = COMPLETION_ROUTES.get(scope["path"])
        gw: Gateway | None = getattr(self.state, "gateway", None)  # None until the lifespan has run
        if endpoint is not None and gw is not None:
            if scope["method"] == "POST":
                await serve_completion(gw, endpoint, scope, receive, send, id_header)
                return
            response = errors.respond(errors.MethodNotAllowed("Method Not Allowed", headers=_ALLOW_POST), gw.metrics)
            response.raw_headers.append(id_header)
            await response(scope, receive, send)
            return

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), id_header]
            await send(message)

        if gw is not None:
            try:
                receive = await guarded_body(gw, scope, receive, console=getattr(self.state, "console", None))
            except errors.GatewayError as exc:
                response = errors.respond(exc, gw.metrics)
                response.raw_headers.append(id_header)
                await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send_with_id)


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


async def guarded_body(gw: Gateway, scope: Scope, receive: Receive, *, console: HasDoor | None = None) -> Receive:
    """Every route FastAPI serves: an ``/admin/`` request is authenticated first (the key's id goes to
    ``scope["state"]``; 401, or 429 for a client that failed too often), then the body is read within its cap
    (``max_admin_body_bytes`` there and on the console, ``max_body_bytes`` elsewhere; 413), before FastAPI parses
    anything. A console request without a live session (but the login form) has its body left unread: FastAPI sees
    an empty one, and the route answers with the login page (``gateway.http.console.door``). Returns the
    ``receive`` that hands FastAPI the body read."""
    admin = scope["path"].startswith(ADMIN_PREFIX)
    on_console = console is not None and console.door.guards(scope["path"])
    if on_console and console is not None and not console.door.may_read_body(scope):
        return _replay(b"", receive)
    if admin:
        client = scope.get("client")
        scope["state"][ADMIN_ID] = gw.admin_guard.authorize(
            _header(scope, b"authorization"), client[0] if client else ""
        )
    limit = gw.settings.max_admin_body_bytes if admin or on_console else gw.settings.max_body_bytes
    return _replay(await read_body(scope, receive, limit), receive)


class HasDoor(Protocol):
    """The console's parts (``gateway.http.console.auth.Console``) as the entry sees them."""

    @property
    def door(self) -> ConsoleDoor: ...


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands over ``body`` as the whole request body, then defers to ``receive``."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()  # a disconnect, for a route that waits on one
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def serve_completion(
    gw: Gateway, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send, id_header: tuple[bytes, bytes]
) -> None:
    """Authenticate (before reading the body), read the body within its limit, run the pipeline, and answer —
    a streamed answer is sent by the pipeline itself, anything else here, errors rendered by
    ``errors.respond``."""
    started = gw.clock.monotonic()
    request_id = scope["state"]["request_id"]
    try:
        principal = await gw.keys.authenticate(_header(scope, b"authorization"))
        raw = await read_body(scope, receive, gw.settings.max_body_bytes)
        response = await complete(
            gw, principal, raw, endpoint=endpoint, request_id=request_id, started=started, receive=receive,
            send=send, headers=(id_header,), request_headers=scope["headers"],
        )  # fmt: skip
    except errors.GatewayError as exc:
        response = errors.respond(exc, gw.metrics)
    except Exception as exc:
        log.exception("unhandled error", exc_info=exc)
        response = errors.respond(errors.GatewayError("Internal error in the gateway."), gw.metrics)
    if response is not None:
        response.raw_headers.append(id_header)
        await response(scope, receive, send)
