"""A call's deadline on its waits for a worker: ``asyncio.timeout`` semantics, one timer per call.

``with deadline.after(s): await …`` ends the wait with ``TimeoutError`` once ``s`` seconds have passed, exactly as
``async with asyncio.timeout(s)`` would (a cancellation of the task from elsewhere stays a cancellation). The
difference is the cost. ``asyncio.timeout`` builds a context object and arms a loop timer for every window, and
cancels it on exit: on uvloop about 13 µs a window, per request twice (first byte, then the whole answer) and once
per chunk of a stream. Here the one ``Deadline`` of a call keeps its timer across windows: a window that ends
before the timer just clears the deadline (a float store), a later window moves it, and the timer, when it fires
before the current deadline (or between windows), re-arms itself for that deadline or does nothing. Only a
window that ends sooner than the timer is set for re-arms it at once.
"""

from __future__ import annotations

import asyncio
import math
from types import TracebackType


class Deadline:
    """The deadline of one task's waits; ``after`` opens a window (use it as a ``with`` block in that task),
    ``close`` drops the timer. It binds to the running loop and task at its first window."""

    __slots__ = ("_armed", "_cancelling", "_expired", "_handle", "_loop", "_task", "_when")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[object] | None = None
        self._when: float | None = None
        """Loop time at which the open window times out; None between windows."""
        self._armed = math.inf
        """Loop time the timer is set for (infinity: no timer)."""
        self._handle: asyncio.TimerHandle | None = None
        self._cancelling = 0
        self._expired = False

    def after(self, delay_s: float) -> Deadline:
        """Open a window that times out ``delay_s`` seconds from now."""
        loop, task = self._loop, self._task
        if loop is None or task is None:
            loop = self._loop = asyncio.get_running_loop()
            task = self._task = asyncio.current_task()
            assert task is not None, "a Deadline is used inside a task"
        when = self._when = loop.time() + delay_s
        self._cancelling = task.cancelling()
        if when < self._armed:  # sooner than the timer: set it again
            if self._handle is not None:
                self._handle.cancel()
            self._armed = when
            self._handle = loop.call_at(when, self._fire)
        return self

    def __enter__(self) -> Deadline:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._when = None
        if self._expired:  # as asyncio.Timeout.__aexit__: our cancellation becomes TimeoutError, no one else's
            self._expired = False
            assert self._task is not None
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc

    def _fire(self) -> None:
        armed, self._armed, self._handle = self._armed, math.inf, None
        when = self._when
        if when is None:  # between windows: the next one sets the timer
            return
        if when > armed:  # the window moved on since the timer was set
            assert self._loop is not None
            self._armed = when
            self._handle = self._loop.call_at(when, self._fire)
            return
        self._expired = True
        assert self._task is not None
        self._task.cancel()

    def close(self) -> None:
        """Drop the timer (the call is over)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._armed = math.inf
        self._when = None
