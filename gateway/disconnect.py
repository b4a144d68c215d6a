"""Cancelling work when the client goes away before the response starts.

Starlette's streaming response notices a disconnect once it streams; before that (admission, queueing at the
worker, prefill, a whole non-streaming generation) nothing would. ``DisconnectGuard`` watches the ASGI
``receive`` channel and cancels the handler's task on ``http.disconnect``; the cancellation closes the
upstream request, so the worker stops generating for nobody. It surfaces as ``ClientDisconnected``.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from starlette.types import Receive

from gateway.errors import ClientDisconnected


class DisconnectGuard:
    """``with DisconnectGuard(receive): …`` — the block is cancelled if the client disconnects meanwhile.
    Use only after the request body has been read (the guard consumes ``receive``)."""

    def __init__(self, receive: Receive | None) -> None:
        self._receive = receive
        self._task: asyncio.Task[object] | None = None
        self._watch: asyncio.Task[None] | None = None
        self.fired = False

    def __enter__(self) -> DisconnectGuard:
        if self._receive is not None:
            self._task = asyncio.current_task()
            self._watch = asyncio.create_task(self._watch_receive(self._receive))
        return self

    async def _watch_receive(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.fired = True
        if self._task is not None:
            self._task.cancel()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self.fired and self._task is not None:
            self._task.uncancel()
            if exc_type is asyncio.CancelledError:
                raise ClientDisconnected("The client closed the connection before the response.") from None
