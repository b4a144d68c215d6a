"""The lab's synchronous coroutine driver (``bench.policy.drive``)."""

from __future__ import annotations

import asyncio

import pytest

from bench.policy.drive import drive


async def _add(a: int, b: int) -> int:
    return a + b


async def _fails() -> int:
    raise LookupError("from the coroutine")


def test_a_coroutine_that_never_suspends_runs_without_the_loop() -> None:
    loop = asyncio.new_event_loop()
    loop.close()  # a closed loop cannot run anything: the result must come from driving the coroutine by hand
    assert drive(_add(2, 3), loop) == 5
    with pytest.raises(LookupError, match="from the coroutine"):
        drive(_fails(), loop)


def test_a_coroutine_that_suspends_is_finished_on_the_loop() -> None:
    loop = asyncio.new_event_loop()
    seen: list[str] = []

    async def waits() -> str:
        await asyncio.sleep(0)  # a bare yield
        ok: asyncio.Future[str] = loop.create_future()
        loop.call_soon(ok.set_result, "value")
        seen.append(await ok)
        bad: asyncio.Future[str] = loop.create_future()
        loop.call_soon(bad.set_exception, LookupError("from the future"))
        try:
            await bad
        except LookupError as e:  # the coroutine, not the driver, receives the future's exception
            seen.append(str(e))
        return "done"

    try:
        assert drive(waits(), loop) == "done"
    finally:
        loop.close()
    assert seen == ["value", "from the future"]
