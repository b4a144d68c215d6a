"""Clocks: every part that waits or measures time takes one, so tests and the virtual-time lab never sleep."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Time source. ``wall`` is Unix seconds (for timestamps), ``monotonic`` is seconds for intervals."""

    def wall(self) -> float: ...
    def monotonic(self) -> float: ...
    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def wall(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class ManualClock:
    """A clock that moves only when told to; ``sleep`` advances it instantly. For tests and virtual time."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._origin = start

    def wall(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now - self._origin

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("seconds: a clock cannot go backwards")
        self._now += seconds

    async def sleep(self, seconds: float) -> None:
        self.advance(max(seconds, 0.0))
        await asyncio.sleep(0)
