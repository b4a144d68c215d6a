"""A task cancelled while it waits on the Redis store must end cancelled. redis-py 8.1's asyncio client drops a
cancellation that arrives at the wrong moment of a command (the command returns normally, the task runs on),
which made a gateway's background loop outlive its shutdown (reliability defect D10)."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable

import pytest

from fleet.store.redis import RedisStore

pytestmark = pytest.mark.redis

TRIALS = 150


async def _lost_cancellations(call: Callable[[], Awaitable[object]], rng: random.Random) -> int:
    """Cancel a task looping on ``call`` at random moments; count the times it carried on regardless."""
    lost = 0
    for _ in range(TRIALS):

        async def loop() -> None:
            nonlocal lost
            while True:
                await call()
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    lost += 1
                    return

        task = asyncio.create_task(loop())
        await asyncio.sleep(rng.random() * 0.004)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        assert done, "a cancelled task did not end within 5 s"
    return lost


async def test_a_cancelled_store_call_always_ends_the_task(redis_url: str) -> None:
    store = RedisStore.from_url(redis_url, prefix=f"rel-cancel-{uuid.uuid4().hex[:8]}:")
    rng = random.Random(5)
    try:
        lost = {
            "worker_states": await _lost_cancellations(store.worker_states, rng),
            "ejected": await _lost_cancellations(lambda: store.ejected(now=0.0), rng),
            "lease_holder": await _lost_cancellations(lambda: store.lease_holder("x"), rng),
        }
    finally:
        await store.close()
    assert lost == dict.fromkeys(lost, 0), f"cancellations dropped out of {TRIALS} per call: {lost}"
