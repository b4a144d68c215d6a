"""The rolling-window math against an exact sliding log: never over the limit, and never refusing what a
window one bucket (1 %) longer would admit."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.clock import ManualClock
from fleet.store.memory import MemoryStore
from fleet.store.protocol import WindowLimit
from fleet.store.window import BUCKETS_PER_WINDOW
from tests.fleet.store_harness import T0

WINDOW_S = 60.0
LIMIT = 1000

steps = st.lists(
    st.tuples(st.floats(min_value=0.0, max_value=8.0), st.integers(min_value=0, max_value=400)),
    min_size=1,
    max_size=120,
)


def exact_used(log: list[tuple[float, int]], now: float, window_s: float) -> int:
    return sum(cost for at, cost in log if now - window_s < at <= now)


@settings(max_examples=150, deadline=None)
@given(steps)
def test_window_is_never_exceeded_and_within_one_bucket_of_exact(plan: list[tuple[float, int]]) -> None:
    async def run() -> None:
        store = MemoryStore(clock=ManualClock(T0))
        log: list[tuple[float, int]] = []
        now = T0
        slack = WINDOW_S / BUCKETS_PER_WINDOW
        for gap, cost in plan:
            now += gap
            limit = WindowLimit(key="tpm", cost=cost, limit=LIMIT, window_s=WINDOW_S)
            admitted = (await store.admit([limit], now=now)).allowed
            if admitted:
                log.append((now, cost))
                assert exact_used(log, now, WINDOW_S) <= LIMIT
            else:
                assert exact_used(log, now, WINDOW_S + slack) + cost > LIMIT

    asyncio.run(run())
