"""Two gateway replicas on a real Redis Cluster (3 masters, 3 replicas): a tenant's requests per minute stay within
1 % of its limit and its concurrent streams never pass its cap, under concurrent load split across the replicas."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.asyncio.cluster import RedisCluster

from bench.procs import Proc
from fleet.store.keys import KeyLayout

from .rel_harness import fire_alternating, fleet_of, redis_replicas, tenants_of

pytestmark = [pytest.mark.redis, pytest.mark.cluster]


async def test_request_limit_holds_across_two_replicas_on_a_cluster(
    shared_workers: list[Proc], redis_cluster_url: str
) -> None:
    rpm = 300
    fleet, tenants = fleet_of([w.url for w in shared_workers]), tenants_of(alpha={"rpm": rpm})
    async with redis_replicas(redis_cluster_url, fleet, tenants, cluster=True, prefix=_prefix()) as gws:
        results = await fire_alternating(gws, 2 * rpm, max_tokens=2)
        for g in gws:
            await g.gw.ledger.idle()
        ledger = await gws[0].store.ledger(since=0, until=float("inf"), limit=10 * rpm)
    admitted = sum(r.ok for r in results)
    assert all(r.status == 429 for r in results if not r.ok), {r.error_type for r in results if not r.ok}
    assert abs(admitted - rpm) <= 0.01 * rpm, admitted
    assert len(ledger) == admitted  # every answered request metered once, in the tenant's slot


async def test_concurrency_cap_holds_across_two_replicas_on_a_cluster(
    shared_workers: list[Proc], redis_cluster_url: str
) -> None:
    cap = 8
    tenants = tenants_of(alpha={"max_concurrency": cap})
    prefix = _prefix()
    probe = RedisCluster.from_url(redis_cluster_url, decode_responses=True)
    await probe.initialize()
    held: list[int] = []
    try:
        async with redis_replicas(
            redis_cluster_url, fleet_of([w.url for w in shared_workers]), tenants, prefix=prefix, cluster=True
        ) as gws:
            watch = asyncio.create_task(_watch(probe, KeyLayout(prefix).limit("concurrency:alpha"), held))
            results = await fire_alternating(gws, 64, max_tokens=40, limit=32)
            watch.cancel()
    finally:
        await probe.aclose()
    served = [r for r in results if r.ok]
    assert len(served) >= cap
    assert any(r.status == 429 for r in results), "the cap never tripped"
    assert all(r.status == 429 for r in results if not r.ok)
    assert 1 < max(held) <= cap


def _prefix() -> str:
    return f"rel-cluster-{uuid.uuid4().hex[:8]}:"


async def _watch(probe: RedisCluster, key: str, held: list[int]) -> None:
    """Sample how many concurrency slots the tenant holds (the slot set's size) every 5 ms until cancelled."""
    while True:
        held.append(int(await probe.zcard(key)))
        await asyncio.sleep(0.005)
