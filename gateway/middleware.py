"""Pure ASGI middleware (no ``BaseHTTPMiddleware``: it buffers and costs time on every request)."""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = "x-request-id"
_VALID_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")


def new_request_id() -> str:
    return f"req-{uuid.uuid4().hex}"


class RequestIdMiddleware:
    """Gives every request an id (the client's ``x-request-id`` when well formed, else a new one), keeps it
    in ``scope["state"]["request_id"]`` and returns it in the ``x-request-id`` response header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = next((v for k, v in scope["headers"] if k == b"x-request-id"), None)
        request_id = incoming.decode() if incoming and _VALID_ID.match(incoming) else new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        await self.app(scope, receive, send_with_id)
