"""What only the Redis store has: replicas sharing state, key prefixing, the ledger stream, and the
check that the Lua scripts and the Python store give bit-identical answers."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import cast

import pytest
from redis.asyncio import Redis

from bench.procs import free_port
from fleet.clock import ManualClock
from fleet.config import CommonSettings
from fleet.store.factory import build_store
from fleet.store.memory import MemoryStore
from fleet.store.protocol import Admission, BudgetLimit, Limit, SlotLimit, UsageRecord, WindowLimit
from fleet.store.redis import RedisStore
from tests.fleet.store_harness import T0

pytestmark = pytest.mark.redis


@pytest.fixture
async def replicas(redis_url: str, key_prefix: str) -> AsyncIterator[tuple[RedisStore, RedisStore]]:
    a = RedisStore.from_url(redis_url, prefix=key_prefix)
    b = RedisStore.from_url(redis_url, prefix=key_prefix)
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


async def test_every_key_carries_the_prefix(redis_url: str, key_prefix: str) -> None:
    store = RedisStore.from_url(redis_url, prefix=key_prefix)
    probe = Redis.from_url(redis_url, decode_responses=True)
    try:
        await store.admit([WindowLimit(key="w", cost=1, limit=5), SlotLimit(key="s", slot_id="x", limit=1)], now=T0)
        await store.settle(windows=(), slots=(), spend={"spend": 1.0}, now=T0)
        await store.acquire_lease("l", "me", ttl_s=30)
        await store.eject("w0", until=T0 + 5, reason="r")
        await store.append_usage(_record())
        keys = [k async for k in probe.scan_iter(match="*")]
        mine = [k for k in keys if k.startswith(key_prefix)]
        assert len(mine) >= 8
        assert f"{key_prefix}usage" in mine
        assert not [k for k in keys if k.startswith(("w", "s", "spend", "lease", "ejected", "usage"))]
    finally:
        await store.close()
        await probe.aclose()


async def test_ledger_stream_holds_one_entry_per_record(redis_url: str, key_prefix: str) -> None:
    client = Redis.from_url(redis_url, decode_responses=True)
    store = RedisStore(client, prefix=key_prefix)
    try:
        for i in range(3):
            await store.append_usage(_record(i))
        await store.append_usage(_record(0))  # a retried append is not billed twice
        entries = cast(list[tuple[str, dict[str, str]]], await client.xrange(f"{key_prefix}usage"))
        ids = [UsageRecord.model_validate_json(fields["record"]).request_id for _, fields in entries]
        assert ids == ["r0", "r1", "r2"]
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
async def test_memory_and_redis_agree_exactly(redis_url: str, key_prefix: str, seed: int) -> None:
    redis_store = RedisStore.from_url(redis_url, prefix=key_prefix)
    try:
        expected = await _scripted_run(MemoryStore(clock=ManualClock(T0)), seed)
        actual = await _scripted_run(redis_store, seed)
    finally:
        await redis_store.close()
    refusals = [a for a in expected if isinstance(a, Admission) and not a.allowed]
    assert {a.tripped for a in refusals} >= {"tpm", "rps", "conc"}  # the run exercised every limit kind
    assert actual == expected


async def test_ping_is_false_when_redis_is_unreachable() -> None:
    store = RedisStore.from_url(f"redis://127.0.0.1:{free_port()}/0", wait_s=1.0)
    try:
        assert not await store.ping()
    finally:
        await store.close()


async def test_factory_builds_the_store_the_settings_ask_for(redis_url: str) -> None:
    memory = build_store(CommonSettings(redis_url=None))
    shared = build_store(CommonSettings(redis_url=redis_url, key_prefix="factory:"))
    try:
        assert isinstance(memory, MemoryStore)
        assert isinstance(shared, RedisStore)
        assert await shared.acquire_lease("factory-test", "me", ttl_s=30)
        probe = Redis.from_url(redis_url, decode_responses=True)
        try:
            assert await probe.get("factory:lease:factory-test") == "me"
        finally:
            await probe.aclose()
        await shared.release_lease("factory-test", "me")
    finally:
        await memory.close()
        await shared.close()


async def test_memory_and_redis_ledgers_agree_exactly(redis_url: str, key_prefix: str) -> None:
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
    memory, shared = MemoryStore(clock=ManualClock(T0)), RedisStore.from_url(redis_url, prefix=key_prefix)
    try:
        for r in records:
            await memory.append_usage(r)
            await shared.append_usage(r)
        for since, until in ranges:
            for tenant in ("a", "b"):
                expected = await memory.usage(tenant, since=since, until=until, limit=5)
                assert await shared.usage(tenant, since=since, until=until, limit=5) == expected
        whole = await shared.usage("a", since=0.0, until=float("inf"), limit=0)
        assert whole.requests == sum(r.tenant == "a" for r in records)
    finally:
        await shared.close()
