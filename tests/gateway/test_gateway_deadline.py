"""``gateway.upstream.deadline.Deadline``: ``asyncio.timeout`` semantics for each window, one timer across them."""

from __future__ import annotations

import asyncio

import pytest

from gateway.upstream.deadline import Deadline


async def _forever() -> None:
    await asyncio.Event().wait()


async def test_a_window_that_outlasts_its_delay_times_out_as_asyncio_timeout_does() -> None:
    deadline = Deadline()
    async with asyncio.timeout(5):
        with pytest.raises(TimeoutError), deadline.after(0.01):
            await _forever()
        with pytest.raises(TimeoutError), deadline.after(0.01):  # and again, on the same deadline
            await _forever()
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    deadline.close()


async def test_a_timer_left_from_a_shorter_window_neither_ends_a_later_window_nor_a_wait_between_windows() -> None:
    deadline = Deadline()
    with deadline.after(0.01):
        pass
    await asyncio.sleep(0.05)  # between windows: the timer fires and does nothing
    with deadline.after(0.01):
        pass
    with deadline.after(60):  # a later deadline: the timer set for 0.01 s fires during the wait and re-arms
        await asyncio.sleep(0.05)
    deadline.close()


async def test_a_window_sooner_than_the_timer_sets_it_again() -> None:
    deadline = Deadline()
    with deadline.after(60):
        pass
    async with asyncio.timeout(5):  # a timer left at 60 s would hang here
        with pytest.raises(TimeoutError), deadline.after(0.01):
            await _forever()
    deadline.close()


async def test_another_cancellation_stays_a_cancellation() -> None:
    async def waits(deadline: Deadline, delay_s: float) -> None:
        with deadline.after(delay_s):
            await _forever()

    task = asyncio.create_task(waits(Deadline(), 60))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    async def both(delay_s: float) -> None:  # cancelled from outside and expired at once, as asyncio.timeout
        deadline = Deadline()
        with deadline.after(delay_s):
            asyncio.current_task().cancel()  # type: ignore[union-attr]
            deadline._fire()  # the timer's callback, run at the same moment
            await asyncio.sleep(0)

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(both(60))


async def test_close_drops_the_timer() -> None:
    deadline = Deadline()
    with deadline.after(0.01):
        pass
    deadline.close()
    assert deadline._handle is None
    await asyncio.sleep(0.03)  # nothing fires
