"""What only the Redis store has: replicas sharing state, the key layout (prefix and cluster hash tags), the
ledger streams, the cluster-mode check at start, and the check that the Lua scripts and the Python store give
bit-identical answers, on a single Redis and on a Redis Cluster."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import cast

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from bench.procs import free_port
from fleet.clock import ManualClock
from fleet.config import CommonSettings
from fleet.store.factory import build_store
from fleet.store.keys import StoreMisconfigured
from fleet.store.memory import MemoryStore
from fleet.store.protocol import Admission, BudgetLimit, Limit, SlotLimit, UsageRecord, WindowLimit
from fleet.store.redis import NotReplicated, RedisStore
from tests.fleet.conftest import redis_store
from tests.fleet.store_harness import T0

pytestmark = pytest.mark.redis


@pytest.fixture
async def replicas(
    request: pytest.FixtureRequest, redis_kind: str, key_prefix: str
) -> AsyncIterator[tuple[RedisStore, RedisStore]]:
    a = await redis_store(request, redis_kind, key_prefix)
    b = await redis_store(request, redis_kind, key_prefix)
    yield a, b
    await a.close()
    await b.close()


async def test_two_replicas_share_limits(replicas: tuple[RedisStore, RedisStore]) -> None:
    a, b = replicas
    limits = [WindowLimit(key="rpm:t", cost=1, limit=50, window_s=60.0)]
    calls = [(a if i % 2 else b).admit(limits, now=T0 + i * 1e-3) for i in range(200)]
    results = await asyncio.gather(*calls)
    assert sum(r.allowed for r in results) == 50
    slot = SlotLimit(key="conc:t", slot_id="r1", limit=1)
    assert (await a.admit([slot], now=T0)).allowed
    assert not (await b.admit([SlotLimit(key="conc:t", slot_id="r2", limit=1)], now=T0)).allowed
    await b.settle(windows=(), slots=[slot], spend={"spend:t": 1.0}, now=T0)
    assert await a.spent("spend:t") == 1.0
    assert (await a.admit([SlotLimit(key="conc:t", slot_id="r2", limit=1)], now=T0)).allowed


async def test_two_replicas_share_leases_and_ejections(replicas: tuple[RedisStore, RedisStore]) -> None:
    a, b = replicas
    assert await a.acquire_lease("controller", "ctl-a", ttl_s=30)
    assert not await b.acquire_lease("controller", "ctl-b", ttl_s=30)
    assert await b.lease_holder("controller") == "ctl-a"
    await a.eject("w0", until=T0 + 30, reason="errors")
    assert await b.ejected(now=T0) == {"w0": T0 + 30}


async def test_every_key_carries_the_prefix_and_a_hash_tag(redis_url: str, key_prefix: str) -> None:
    store = RedisStore.from_url(redis_url, prefix=key_prefix)
    probe = Redis.from_url(redis_url, decode_responses=True)
    try:
        await store.admit([WindowLimit(key="w:t", cost=1, limit=5), SlotLimit(key="s:t", slot_id="x", limit=1)], now=T0)
        await store.settle(windows=(), slots=(), spend={"spend:t": 1.0}, now=T0)
        await store.acquire_lease("l", "me", ttl_s=30)
        await store.eject("w0", until=T0 + 5, reason="r")
        await store.append_usage(_record())
        keys = {k async for k in probe.scan_iter(match="*")}
        mine = {k for k in keys if k.startswith(key_prefix)}
        tagged = {f"{key_prefix}{{t:t}}:limit:{kind}" for kind in ("w", "s", "spend")}
        tagged |= {f"{key_prefix}{{t:t}}:ledger:{part}" for part in ("stream", "index", "rollup", "ids")}
        tagged |= {f"{key_prefix}{{lease:l}}", f"{key_prefix}{{ejected}}:until", f"{key_prefix}{{ledger}}:tenants"}
        assert tagged <= mine
        unprefixed = ("w:", "s:", "spend:", "settled:", "lease", "ejected", "usage", "{")
        assert not [k for k in keys if k.startswith(unprefixed)]
    finally:
        await store.close()
        await probe.aclose()


async def test_ledger_stream_holds_one_entry_per_request(
    request: pytest.FixtureRequest, redis_kind: str, key_prefix: str
) -> None:
    store = await redis_store(request, redis_kind, key_prefix)
    url = request.getfixturevalue("redis_cluster_url" if redis_kind == "cluster" else "redis_url")
    client: Redis | RedisCluster = (
        RedisCluster.from_url(url, decode_responses=True)
        if redis_kind == "cluster"
        else Redis.from_url(url, decode_responses=True)
    )
    try:
        for i in range(3):
            await store.append_usage(_record(i))
        await store.append_usage(_record(0).model_copy(update={"at": T0 + 9}))  # a rebuilt retry is not billed twice
        stream = f"{key_prefix}{{t:t}}:ledger:stream"
        entries = cast(list[tuple[str, dict[str, str]]], await client.xrange(stream))
        ids = [UsageRecord.model_validate_json(fields["record"]).request_id for _, fields in entries]
        assert ids == ["r0", "r1", "r2"]
    finally:
        await store.close()
        await client.aclose()


async def test_a_cluster_node_without_cluster_mode_is_refused(redis_cluster_url: str) -> None:
    store = RedisStore.from_url(redis_cluster_url)
    try:
        with pytest.raises(StoreMisconfigured, match="GEARSHIFT_REDIS_CLUSTER=true"):
            await store.verify()
    finally:
        await store.close()


async def test_cluster_mode_on_a_plain_redis_is_refused(redis_url: str) -> None:
    store = RedisStore.from_url(redis_url, cluster=True)
    try:
        with pytest.raises(StoreMisconfigured, match="unset GEARSHIFT_REDIS_CLUSTER"):
            await store.verify()
    finally:
        await store.close()


async def test_matching_modes_and_an_unreachable_store_pass_the_check(
    request: pytest.FixtureRequest, redis_kind: str
) -> None:
    for store in (
        await redis_store(request, redis_kind, "verify:"),
        RedisStore.from_url(f"redis://127.0.0.1:{free_port()}/0", wait_s=1.0),
    ):
        try:
            await store.verify()
        finally:
            await store.close()


def _record(i: int = 0) -> UsageRecord:
    return UsageRecord(
        request_id=f"r{i}",
        tenant="t",
        model="m",
        worker_id=None,
        prompt_tokens=1,
        completion_tokens=2,
        cost_usd=0.1,
        status="ok",
        at=T0 + i,
    )


def _random_limits(rng: random.Random) -> list[Limit]:
    limits: list[Limit] = []
    if rng.random() < 0.8:
        limits.append(WindowLimit(key="tpm", cost=rng.randint(0, 400), limit=2000, window_s=60.0))
    if rng.random() < 0.5:
        limits.append(WindowLimit(key="rps", cost=1, limit=7, window_s=1.0))
    if rng.random() < 0.5:
        limits.append(SlotLimit(key="conc", slot_id=f"s{rng.randint(0, 9)}", limit=4, ttl_s=rng.uniform(0.5, 20)))
    if rng.random() < 0.3:
        limits.append(BudgetLimit(key="spend", limit_usd=3.0))
    rng.shuffle(limits)
    return limits


async def _scripted_run(store: MemoryStore | RedisStore, seed: int) -> list[Admission | float]:
    """A seeded random mix of admits and settles with time moving forward irregularly."""
    rng, now = random.Random(seed), T0
    out: list[Admission | float] = []
    admitted: list[tuple[float, list[Limit]]] = []
    for _ in range(400):
        now += rng.choice([0.0, 0.001, 0.13, 0.6, 2.5, 9.7])
        limits = _random_limits(rng)
        admission = await store.admit(limits, now=now)
        out.append(admission)
        if admission.allowed:
            admitted.append((now, limits))
        if admitted and rng.random() < 0.4:
            at, done = admitted.pop(rng.randrange(len(admitted)))
            windows = [
                WindowLimit(
                    key=w.key,
                    cost=rng.randint(-w.cost, 50),
                    limit=w.limit,
                    window_s=w.window_s,
                    reserved_at=at if rng.random() < 0.8 else None,
                )
                for w in done
                if isinstance(w, WindowLimit)
            ]
            slots = [s for s in done if isinstance(s, SlotLimit)]
            await store.settle(windows=windows, slots=slots, spend={"spend": rng.choice([0.0, 0.1, 0.35])}, now=now)
            out.append(await store.spent("spend"))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_memory_and_redis_agree_exactly(
    request: pytest.FixtureRequest, redis_kind: str, key_prefix: str, seed: int
) -> None:
    shared = await redis_store(request, redis_kind, key_prefix)
    try:
        expected = await _scripted_run(MemoryStore(clock=ManualClock(T0)), seed)
        actual = await _scripted_run(shared, seed)
    finally:
        await shared.close()
    refusals = [a for a in expected if isinstance(a, Admission) and not a.allowed]
    assert {a.tripped for a in refusals} >= {"tpm", "rps", "conc"}  # the run exercised every limit kind
    assert actual == expected


async def test_ping_is_false_when_redis_is_unreachable() -> None:
    store = RedisStore.from_url(f"redis://127.0.0.1:{free_port()}/0", wait_s=1.0)
    try:
        assert not await store.ping()
    finally:
        await store.close()


async def test_factory_builds_the_store_the_settings_ask_for(redis_url: str, redis_cluster_url: str) -> None:
    memory = build_store(CommonSettings(redis_url=None))
    shared = build_store(CommonSettings(redis_url=redis_url, key_prefix="factory:"))
    clustered = build_store(CommonSettings(redis_url=redis_cluster_url, redis_cluster=True, key_prefix="factory:"))
    try:
        assert isinstance(memory, MemoryStore)
        assert isinstance(shared, RedisStore)
        assert not shared.cluster
        assert isinstance(clustered, RedisStore)
        assert clustered.cluster
        assert await shared.acquire_lease("factory-test", "me", ttl_s=30)
        probe = Redis.from_url(redis_url, decode_responses=True)
        try:
            assert await probe.get("factory:{lease:factory-test}") == "me"
        finally:
            await probe.aclose()
        await shared.release_lease("factory-test", "me")
        assert await clustered.acquire_lease("factory-test", "you", ttl_s=30)
        assert await clustered.lease_holder("factory-test") == "you"
        await clustered.release_lease("factory-test", "you")
    finally:
        await memory.close()
        await shared.close()
        await clustered.close()


async def test_memory_and_redis_ledgers_agree_exactly(
    request: pytest.FixtureRequest, redis_kind: str, key_prefix: str
) -> None:
    rng = random.Random(7)
    records = [
        UsageRecord(
            request_id=f"r{i}",
            tenant=rng.choice(["a", "b"]),
            model="m",
            worker_id=None,
            prompt_tokens=rng.randint(0, 5000),
            completion_tokens=rng.randint(0, 900),
            cost_usd=rng.uniform(0, 0.2),
            status="ok",
            at=T0 + rng.uniform(0, 2 * 86_400),
        )
        for i in range(400)
    ]
    ranges = [(T0 + rng.uniform(0, 86_400), T0 + rng.uniform(86_400, 2 * 86_400)) for _ in range(20)]
    ranges += [(0.0, float("inf")), (T0 + 600.5, T0 + 600.75)]
    memory, shared = MemoryStore(clock=ManualClock(T0)), await redis_store(request, redis_kind, key_prefix)
    try:
        for r in records:
            await memory.append_usage(r)
            await shared.append_usage(r)
        for since, until in ranges:
            for tenant in ("a", "b"):
                expected = await memory.usage(tenant, since=since, until=until, limit=5)
                assert await shared.usage(tenant, since=since, until=until, limit=5) == expected
        assert await shared.ledger(since=T0, until=T0 + 86_400, limit=50) == await memory.ledger(
            since=T0, until=T0 + 86_400, limit=50
        )
        whole = await shared.usage("a", since=0.0, until=float("inf"), limit=0)
        assert whole.requests == sum(r.tenant == "a" for r in records)
    finally:
        await shared.close()


async def test_a_ledger_append_waits_for_the_replicas_it_is_told_to(
    redis_kind: str, key_prefix: str, request: pytest.FixtureRequest
) -> None:
    """On the single Redis (no replica) a record cannot be replicated: the append fails, so the gateway keeps it
    spooled; on the cluster (one replica per master) it returns once the replica has it."""
    url = request.getfixturevalue("redis_cluster_url" if redis_kind == "cluster" else "redis_url")
    store = RedisStore.from_url(url, prefix=key_prefix, cluster=redis_kind == "cluster", wait_replicas=1)
    try:
        await store.verify()
        if redis_kind == "cluster":
            await store.append_usage(_record())
            assert (await store.usage("t", since=0, until=T0 + 100)).requests == 1
        else:
            with pytest.raises(NotReplicated):
                await store.append_usage(_record())
    finally:
        await store.close()
