"""Pure ASGI middleware (no ``BaseHTTPMiddleware``: it buffers and costs time on every request)."""

from __future__ import annotations

import random

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = "x-request-id"


def new_request_id() -> str:
    """``req-`` and 128 random bits. Request ids are not secrets: the ``random`` module's PRNG (seeded from the
    OS) instead of a urandom call per request."""
    return f"req-{random.getrandbits(128):032x}"


class RequestIdMiddleware:
    """Gives every request a new id, keeps it in ``scope["state"]["request_id"]`` and returns it in the
    ``x-request-id`` response header. A client's own ``x-request-id`` is not reused: the id keys the request's
    concurrency slot, so a client must not be able to make two requests share one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        header = (REQUEST_ID_HEADER.encode(), request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        await self.app(scope, receive, send_with_id)
