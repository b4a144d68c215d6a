"""The SSE response of a streamed completion."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class RelayResponse(StreamingResponse):
    """A streaming response that calls ``on_unfinished`` if it ends without the body having run to its end.

    The body generator meters and releases its request in its own ``finally`` — but only once it has started.
    A client that disconnects before the first chunk is sent can make Starlette cancel the response before it
    ever iterates the body; ``on_unfinished`` covers that case (it must be idempotent)."""

    def __init__(self, body: AsyncIterator[bytes], *, on_unfinished: Callable[[], None]) -> None:
        super().__init__(body, media_type="text/event-stream", headers=SSE_HEADERS)
        self._on_unfinished = on_unfinished

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_unfinished()
