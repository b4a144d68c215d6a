"""Keeping task cancellation intact across a client library that drops it.

redis-py 8.1's asyncio client lets a command finish and return normally when the calling task is cancelled
while the command is in flight: the ``CancelledError`` never reaches the caller, so a cancelled background loop
runs on and a shutdown that cancels it hangs. ``cancellation_safe`` wraps every public coroutine method of a
class so that a cancellation requested during the call is raised as soon as the call returns (the call's own
effect has happened by then, as it would have if the cancellation had arrived a moment later).

A hot method can skip the wrapper's extra coroutine frame by doing the same check itself around its one
client call (``cancelling_now`` before, ``raise_if_cancelled_since`` after) and being marked with
``checks_own_cancellation``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

Method = Callable[..., Coroutine[Any, Any, Any]]


_OWN_CHECK = "__checks_own_cancellation__"
_current_task = asyncio.current_task


def cancelling_now() -> tuple[asyncio.Task[Any] | None, int]:
    """The current task and its pending cancellation count, to pass to ``raise_if_cancelled_since``."""
    task = _current_task()
    return task, task.cancelling() if task is not None else 0


def raise_if_cancelled_since(task: asyncio.Task[Any] | None, before: int, what: str) -> None:
    """Raise ``CancelledError`` when ``task`` was cancelled after ``cancelling_now`` returned ``before``."""
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError(f"cancelled during {what} (the client dropped it)")


def checks_own_cancellation(method: T) -> T:
    """Mark a coroutine method that already checks for a dropped cancellation; ``cancellation_safe`` skips it."""
    setattr(method, _OWN_CHECK, True)
    return method


def _raising_lost_cancellation(method: Method) -> Method:
    @functools.wraps(method)
    async def call(*args: Any, **kwargs: Any) -> Any:
        task, before = cancelling_now()
        result = await method(*args, **kwargs)
        raise_if_cancelled_since(task, before, method.__qualname__)
        return result

    return call


def cancellation_safe(cls: type[T]) -> type[T]:
    """Class decorator: every public ``async def`` of ``cls`` (except those marked ``checks_own_cancellation``)
    re-raises a cancellation its awaits swallowed."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.iscoroutinefunction(member) and not getattr(member, _OWN_CHECK, False):
            setattr(cls, name, _raising_lost_cancellation(member))
    return cls
