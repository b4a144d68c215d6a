"""Cancelling work when the client goes away before the response starts.

Starlette's streaming response notices a disconnect once it streams; before that (admission, queueing at the
worker, prefill, a whole non-streaming generation) nothing would. ``DisconnectGuard`` watches the ASGI
``receive`` channel and cancels the handler's task on ``http.disconnect``; the cancellation closes the
upstream request, so the worker stops generating for nobody. It surfaces as ``ClientDisconnected``.

The watcher task starts only once the guarded block has run for ``arm_after_s``: most requests to a fast
upstream finish sooner, and a timer costs far less than a task on the hot path.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from starlette.types import Receive

from gateway.errors import ClientDisconnected

ARM_AFTER_S = 0.05


class DisconnectGuard:
    """``with DisconnectGuard(receive): …`` — the block is cancelled if the client disconnects meanwhile.
    Use only after the request body has been read (the guard consumes ``receive``)."""

    def __init__(self, receive: Receive | None, *, arm_after_s: float = ARM_AFTER_S) -> None:
        self._receive = receive
        self._arm_after_s = arm_after_s
        self._task: asyncio.Task[object] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._watch: asyncio.Task[None] | None = None
        self.fired = False

    def __enter__(self) -> DisconnectGuard:
        if self._receive is not None:
            self._task = asyncio.current_task()
            self._timer = asyncio.get_running_loop().call_later(self._arm_after_s, self._arm)
        return self

    def _arm(self) -> None:
        self._timer = None
        if self._receive is not None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_receive(self._receive))

    async def _watch_receive(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.fired = True
        if self._task is not None:
            self._task.cancel()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._watch is not None:
            self._watch.cancel()
        if self.fired and self._task is not None:
            self._task.uncancel()
            if exc_type is asyncio.CancelledError:
                raise ClientDisconnected("The client closed the connection before the response.") from None
