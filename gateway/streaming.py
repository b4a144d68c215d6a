"""The SSE response of a streamed completion."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.disconnect import DisconnectGuard
from gateway.errors import ClientDisconnected

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class RelayResponse(StreamingResponse):
    """A streaming response that calls ``on_unfinished`` if it ends without the body having run to its end.

    The body generator meters and releases its request in its own ``finally`` — but only once it has started.
    A client that disconnects before the first chunk is sent can end the response before it ever iterates the
    body; ``on_unfinished`` covers that case (it must be idempotent).

    ``__call__`` replaces Starlette's: on uvicorn (ASGI spec 2.3) Starlette watches for a disconnect with an
    anyio task group — two tasks and a cancel scope per stream, a large share of a short stream's cost. A
    ``DisconnectGuard`` does the same job (cancel the relay when the client goes away) with a timer, and a
    watcher task only for streams that last longer than its arming delay."""

    def __init__(self, body: AsyncIterator[bytes], *, on_unfinished: Callable[[], None]) -> None:
        super().__init__(body, media_type="text/event-stream", headers=SSE_HEADERS)
        self._on_unfinished = on_unfinished

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = self.body_iterator
        try:
            with contextlib.suppress(ClientDisconnected, OSError), DisconnectGuard(receive):
                await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                async for chunk in body:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            aclose = getattr(body, "aclose", None)
            if aclose is not None:  # a relay cut short at a ``send`` is still suspended: run its ``finally`` now
                await aclose()
            self._on_unfinished()
