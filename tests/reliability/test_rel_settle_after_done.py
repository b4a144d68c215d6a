"""The end of a stream does not wait on the store: ``[DONE]`` goes out before the settlement lands. A sequential
client at its concurrency limit is never refused for its own finished request on the same replica (local
accounting), and across replicas only when the settlement takes longer than ``concurrency_grace_s`` to land."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import aiohttp
import pytest

from bench.procs import Proc
from bench.soak.client import stream_chat
from fleet.clock import SystemClock
from fleet.store.memory import MemoryStore
from fleet.store.protocol import Settlement
from gateway.errors import RateLimited
from gateway.intake.admission import Admitter
from gateway.usage.metrics import GatewayMetrics

from .rel_harness import KEYS, chat, fleet_of, live_gateway, redis_replicas, tenants_of

GRACE_S = 0.05


class HeldSettlements(MemoryStore):
    """A memory store whose settlements wait until ``release`` is set (a slow store round trip)."""

    def __init__(self) -> None:
        super().__init__(clock=SystemClock())
        self.release = asyncio.Event()
        self.waiting = 0

    async def settle_many(self, settlements: Sequence[Settlement], *, now: float) -> None:
        self.waiting += 1
        await self.release.wait()
        await super().settle_many(settlements, now=now)


async def test_done_goes_out_before_the_settlement_and_the_next_request_is_admitted(
    shared_workers: list[Proc],
) -> None:
    store = HeldSettlements()
    tenants = tenants_of(alpha={"max_concurrency": 1})
    async with live_gateway(fleet_of([w.url for w in shared_workers]), tenants, store=store) as live:
        async with aiohttp.ClientSession() as s:
            results = [await stream_chat(s, live.url, key=KEYS["alpha"], body=chat(3)) for _ in range(5)]
        assert store.waiting == 1, "the settlement was not left to the background"
        store.release.set()
        await live.gw.ledger.idle()
    assert all(r.ok and r.done for r in results), [r.error_type for r in results]


@pytest.mark.redis
async def test_a_sequential_client_at_its_limit_is_never_refused_on_one_replica_or_across_two(
    shared_workers: list[Proc], redis_url: str
) -> None:
    tenants = tenants_of(alpha={"max_concurrency": 1})
    fleet = fleet_of([w.url for w in shared_workers])
    prefix = f"rel-seq-{uuid.uuid4().hex[:8]}:"
    async with redis_replicas(redis_url, fleet, tenants, prefix=prefix) as gws, aiohttp.ClientSession() as s:
        same = [await stream_chat(s, gws[0].url, key=KEYS["alpha"], body=chat(2)) for _ in range(30)]
        across = [await stream_chat(s, gws[i % 2].url, key=KEYS["alpha"], body=chat(2)) for i in range(30)]
    assert all(r.ok for r in same), [r.error_type for r in same]
    assert all(r.ok for r in across), [r.error_type for r in across]


@pytest.mark.parametrize(("lands_after_s", "refused"), [(GRACE_S / 5, False), (GRACE_S * 4, True)])
async def test_across_replicas_a_finished_slot_is_refused_only_past_the_grace(
    lands_after_s: float, refused: bool
) -> None:
    clock, store = SystemClock(), MemoryStore(clock=SystemClock())
    tenant = tenants_of(alpha={"max_concurrency": 1}).tenants[0]
    a, b = (Admitter(store, clock=clock, metrics=GatewayMetrics(), concurrency_grace_s=GRACE_S) for _ in "ab")
    ticket = await a.admit(tenant, request_id="first", tokens=1)
    settlement = await a.finish(ticket, used_tokens=1, cost_usd=0.0)
    assert settlement is not None

    async def land() -> None:
        await asyncio.sleep(lands_after_s)
        await store.settle_many([settlement], now=clock.wall())

    landing = asyncio.create_task(land())
    try:
        if refused:
            with pytest.raises(RateLimited):
                await b.admit(tenant, request_id="next", tokens=1)
        else:
            await b.admit(tenant, request_id="next", tokens=1)
    finally:
        await landing
