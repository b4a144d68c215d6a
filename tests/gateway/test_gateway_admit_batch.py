"""Admits batched per event-loop tick (gateway.intake.admit_batch): one store round trip for a tick's admits, each
answered as alone, and a cancelled request's grant undone."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from fleet.clock import ManualClock
from fleet.store.memory import MemoryStore
from fleet.store.protocol import Admission, Limit, SlotLimit, WindowLimit
from gateway.intake.admit_batch import AdmitBatcher


class CountingStore(MemoryStore):
    """Counts round trips: one per admit or admit_many call."""

    def __init__(self, *, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.round_trips = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def admit(self, limits: Sequence[Limit], *, now: float) -> Admission:
        self.round_trips += 1
        await self.gate.wait()
        return await super().admit(limits, now=now)

    async def admit_many(self, calls: Sequence[tuple[Sequence[Limit], float]]) -> list[Admission]:
        self.round_trips += 1
        await self.gate.wait()
        return [await MemoryStore.admit(self, limits, now=now) for limits, now in calls]


def slot(i: int) -> SlotLimit:
    return SlotLimit(key="concurrency:t", slot_id=f"r{i}", limit=5)


async def test_one_ticks_admits_are_one_round_trip_each_answered_as_alone() -> None:
    clock = ManualClock()
    store = CountingStore(clock=clock)
    batcher = AdmitBatcher(store)
    now = clock.wall()
    results = await asyncio.gather(*(batcher.admit([slot(i)], now=now) for i in range(8)))
    assert store.round_trips == 1
    assert [r.allowed for r in results] == [True] * 5 + [False] * 3  # in order, the limit of 5 exact
    assert (await batcher.admit([slot(99)], now=now)).tripped == "concurrency:t"
    assert store.round_trips == 2


async def test_a_request_cancelled_in_flight_has_its_grant_undone() -> None:
    clock = ManualClock()
    store = CountingStore(clock=clock)
    batcher = AdmitBatcher(store)
    now = clock.wall()
    store.gate.clear()
    window = WindowLimit(key="rpm:t", cost=1, limit=1)
    waiting = asyncio.ensure_future(
        batcher.admit([window, SlotLimit(key="concurrency:t", slot_id="a", limit=1)], now=now)
    )
    await asyncio.sleep(0.01)
    waiting.cancel()
    store.gate.set()
    await batcher.idle()
    assert waiting.cancelled()
    # the cancelled request holds neither the slot nor the request in the window
    again = await MemoryStore.admit(store, [window, SlotLimit(key="concurrency:t", slot_id="b", limit=1)], now=now)
    assert again.allowed


async def test_a_ticks_admits_are_sent_in_the_loops_next_iteration() -> None:
    clock = ManualClock()
    store = CountingStore(clock=clock)
    batcher = AdmitBatcher(store)
    admits = [asyncio.ensure_future(batcher.admit([slot(i)], now=clock.wall())) for i in range(3)]
    await asyncio.sleep(0)  # this iteration: the admits queue
    assert store.round_trips == 0
    await asyncio.sleep(0)  # the next one: the batch goes, no callback hop before it
    assert store.round_trips == 1
    assert all(r.allowed for r in await asyncio.gather(*admits))
