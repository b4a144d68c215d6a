"""Keeping task cancellation intact across a client library that drops it.

redis-py 8.1's asyncio client lets a command finish and return normally when the calling task is cancelled
while the command is in flight: the ``CancelledError`` never reaches the caller, so a cancelled background loop
runs on and a shutdown that cancels it hangs. ``cancellation_safe`` wraps every public coroutine method of a
class so that a cancellation requested during the call is raised as soon as the call returns (the call's own
effect has happened by then, as it would have if the cancellation had arrived a moment later).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

Method = Callable[..., Coroutine[Any, Any, Any]]


def _raising_lost_cancellation(method: Method) -> Method:
    @functools.wraps(method)
    async def call(*args: Any, **kwargs: Any) -> Any:
        task = asyncio.current_task()
        before = task.cancelling() if task is not None else 0
        result = await method(*args, **kwargs)
        if task is not None and task.cancelling() > before:
            raise asyncio.CancelledError(f"cancelled during {method.__qualname__} (the client dropped it)")
        return result

    return call


def cancellation_safe(cls: type[T]) -> type[T]:
    """Class decorator: every public ``async def`` of ``cls`` re-raises a cancellation its awaits swallowed."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.iscoroutinefunction(member):
            setattr(cls, name, _raising_lost_cancellation(member))
    return cls
