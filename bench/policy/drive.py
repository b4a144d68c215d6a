"""Run a coroutine that rarely suspends without paying an event-loop round trip per call.

The lab's routing awaits the gateway's async router once per request, and the router's filters and scorers never
suspend: driving the coroutine by hand (``send(None)`` until ``StopIteration``) gives the same result without the
loop's task and scheduling overhead. Should the coroutine suspend after all, it is finished on ``loop``: the
awaitable it stopped on is waited for there and the coroutine resumed until it returns.

A coroutine that needs a running loop before its first suspension (``asyncio.get_running_loop``) is not for this.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar, cast

T = TypeVar("T")


def drive(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> T:
    """``coro``'s result: computed synchronously while it does not suspend, then on ``loop``."""
    try:
        yielded = coro.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    return loop.run_until_complete(_resume(coro, yielded))


async def _resume(coro: Coroutine[Any, Any, T], yielded: Any) -> T:
    """Finish ``coro`` on the running loop from a suspension at ``yielded`` (a future, or None for a bare yield)."""
    while True:
        if yielded is None:
            await asyncio.sleep(0)
        else:
            await asyncio.wait({yielded})  # the coroutine itself takes the future's result or exception
        try:
            yielded = coro.send(None)
        except StopIteration as done:
            return cast(T, done.value)
