"""Rides (``fleet.store.rides``): while admits flow, a Redis store's ledger appends, settlements, lease grants and
background reads wait for the next admit and go in its script call (one command for all), each getting what it would
have got alone; a failing rider fails alone; one that no admit takes goes alone; a cancelled one never runs; a lost
connection fails the riders with the admit. On a cluster only riders of the admit's tenant slot go with it.

Counts are the scripts and transactions Redis ran (``INFO commandstats``); each rider's wait is long (seconds) so
that a slow machine changes no count."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from bench.gateway.commands import redis_commands
from bench.procs import start_redis
from fleet.store.protocol import Admission, Settlement, SlotLimit, UsageRecord, WindowLimit
from fleet.store.redis import RedisStore
from tests.fleet.store_harness import T0

pytestmark = pytest.mark.redis


async def round_trips(url: str) -> int:
    """The gateway's calls to the Redis at ``url`` so far (``bench.gateway.commands.redis_commands``)."""
    return await asyncio.to_thread(redis_commands, url)


def slot(i: int, tenant: str = "acme") -> SlotLimit:
    return SlotLimit(key=f"concurrency:{tenant}", slot_id=f"r{i}", limit=10)


def record(request_id: str, tenant: str = "acme") -> UsageRecord:
    return UsageRecord(request_id=request_id, tenant=tenant, model="m", worker_id="w0", prompt_tokens=10,
                       completion_tokens=5, cost_usd=0.25, status="ok", at=T0)  # fmt: skip


async def riders_waiting(store: RedisStore, n: int) -> None:
    """Until ``n`` riders wait for an admit (each caller has posted its call)."""
    for _ in range(1000):
        if len(store._rides.waiting) >= n:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{len(store._rides.waiting)} riders wait, expected {n}")


async def carry(store: RedisStore, *calls: Any, tenant: str = "acme") -> list[Any]:
    """Run ``calls`` (store coroutines), each riding on one admit of ``tenant`` sent once all of them wait."""
    gathered = asyncio.gather(*calls)
    await riders_waiting(store, len(calls))
    assert (await store.admit([WindowLimit(key=f"rpm:{tenant}", cost=1, limit=1000)], now=T0)).allowed
    return list(await gathered)


@pytest.fixture
async def store(redis_url: str, key_prefix: str) -> Any:
    s = RedisStore.from_url(redis_url, prefix=key_prefix, server_clock=False, ride_s=5.0)
    await s.verify()
    yield s
    await s.close()


async def test_writes_and_reads_ride_on_the_next_admit(store: RedisStore, redis_url: str) -> None:
    assert (await store.admit([slot(0)], now=T0)).allowed  # admits flow
    await carry(store, store.append_usage_many([record("r0")]))  # acme joins the ledger's tenants (a plain SADD)
    before = await round_trips(redis_url)
    calls = asyncio.gather(
        store.append_usage_many([record("r1")]),
        store.settle_many([Settlement("s0", slots=(slot(0),))], now=T0),
        store.worker_states(),
        store.docs("tenants"),
        store.ejected(now=T0),
        store.replica_heartbeat("g1", ttl_s=6.0, now=T0),
        store.admit_riding([WindowLimit(key="rpm:acme", cost=5, limit=100)], now=T0),
    )
    await riders_waiting(store, 7)
    full = [SlotLimit(key="concurrency:acme", slot_id="r2", limit=1)]  # r0's release rode before it: room for one
    assert (await store.admit(full, now=T0)).allowed
    _, _, states, docs, ejected, alive, grant = await calls
    assert await round_trips(redis_url) - before == 1  # the admit, carrying all seven
    assert (states, docs, ejected, alive) == ({}, {}, {}, 1)
    assert isinstance(grant, Admission)
    assert grant.allowed
    totals = await store.usage("acme", since=0, until=math.inf)
    assert (totals.requests, totals.cost_usd) == (1 + 1, 0.5)
    assert await store.spent("spend:acme") == 0.5


async def test_a_failing_rider_fails_alone(store: RedisStore, redis_url: str, key_prefix: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:  # bad's ledger ids are not a hash: its append fails inside the script
        await client.set(f"{key_prefix}{{t:bad}}:ledger:ids", "not a hash")
    finally:
        await client.aclose()
    assert (await store.admit([slot(0)], now=T0)).allowed  # admits flow
    append = asyncio.ensure_future(store.append_usage_many([record("b1", "bad")]))
    settle = asyncio.ensure_future(store.settle_many([Settlement("s0", slots=(slot(0),))], now=T0))
    await riders_waiting(store, 2)
    assert (await store.admit([slot(1)], now=T0)).allowed
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await append
    await settle


async def test_a_rider_no_admit_takes_goes_alone(redis_url: str, key_prefix: str) -> None:
    store = RedisStore.from_url(redis_url, prefix=key_prefix, server_clock=False, ride_s=0.05)
    try:
        assert (await store.admit([slot(0)], now=T0)).allowed
        await store.settle_many([Settlement("s", slots=(slot(9),))], now=T0)  # Redis has the script from now on
        before = await round_trips(redis_url)
        await store.settle_many([Settlement("s0", slots=(slot(0),))], now=T0)  # no admit follows
        assert await round_trips(redis_url) - before == 1
        one = [SlotLimit(key="concurrency:acme", slot_id="r1", limit=1)]
        assert (await store.admit(one, now=T0)).allowed  # r0's slot was released
    finally:
        await store.close()


async def test_a_cancelled_rider_never_runs(store: RedisStore) -> None:
    assert (await store.admit([slot(0)], now=T0)).allowed
    await carry(store, store.append_usage_many([record("r0")]))
    append = asyncio.ensure_future(store.append_usage_many([record("r1")]))
    await riders_waiting(store, 1)
    append.cancel()
    with pytest.raises(asyncio.CancelledError):
        await append
    assert (await store.admit([slot(1)], now=T0)).allowed
    assert (await store.usage("acme", since=0, until=math.inf)).requests == 1


async def test_a_lost_connection_fails_the_riders_with_the_admit(tmp_path: Path, key_prefix: str) -> None:
    server = start_redis(log_dir=tmp_path)
    store = RedisStore.from_url(server.url, prefix=key_prefix, server_clock=False, ride_s=5.0, wait_s=1.0)
    try:
        assert (await store.admit([slot(0)], now=T0)).allowed
        settle = asyncio.ensure_future(store.settle_many([Settlement("s0", slots=(slot(0),))], now=T0))
        await riders_waiting(store, 1)
        server.stop()
        with pytest.raises(RedisConnectionError):
            await store.admit([slot(1)], now=T0)
        with pytest.raises(RedisConnectionError):  # its caller sees the failure (the writer then spools or retries)
            await settle
    finally:
        server.stop()
        await store.close()


@pytest.mark.cluster
async def test_on_a_cluster_only_the_admits_tenant_rides(redis_cluster_url: str, key_prefix: str) -> None:
    store = RedisStore.from_url(redis_cluster_url, prefix=key_prefix, cluster=True, server_clock=False, ride_s=5.0)
    await store.verify()
    try:
        assert (await store.admit([slot(0)], now=T0)).allowed
        await carry(store, store.append_usage_many([record("r0")]))
        await carry(store, store.append_usage_many([record("o0", "other")]), tenant="other")
        mine = asyncio.gather(
            store.append_usage_many([record("r1")]),
            store.settle_many([Settlement("s0", slots=(slot(0),))], now=T0),
            store.admit_riding([WindowLimit(key="rpm:acme", cost=5, limit=100)], now=T0),
        )
        theirs = asyncio.ensure_future(store.append_usage_many([record("o1", "other")]))
        await riders_waiting(store, 4)
        assert await store.docs("tenants") == {}  # a fleet-wide key's slot is not a tenant's: it never waits
        one = [SlotLimit(key="concurrency:acme", slot_id="r1", limit=1)]
        assert (await store.admit(one, now=T0)).allowed  # carries acme's three, after which r0's slot is free
        _, _, grant = await mine
        assert grant.allowed
        assert len(store._rides.waiting) == 1  # other's append waits for an admit of its own slot
        assert (await store.admit([slot(0, "other")], now=T0)).allowed
        await theirs
        assert (await store.usage("acme", since=0, until=math.inf)).requests == 2
        assert (await store.usage("other", since=0, until=math.inf)).requests == 2
    finally:
        await store.close()


async def test_riders_get_their_replies_when_the_admit_carrying_them_is_cancelled(store: RedisStore) -> None:
    assert (await store.admit([slot(0)], now=T0)).allowed
    settle = asyncio.ensure_future(store.settle_many([Settlement("s0", slots=(slot(0),))], now=T0))
    await riders_waiting(store, 1)
    admit = asyncio.ensure_future(store.admit([slot(1)], now=T0))
    await asyncio.sleep(0)  # the admit has sent its bundle and waits for the reply
    admit.cancel()
    with pytest.raises(asyncio.CancelledError):
        await admit
    async with asyncio.timeout(10):
        await settle  # the settlement ran, and its caller heard so
    one = [SlotLimit(key="concurrency:acme", slot_id="r2", limit=2)]  # r1 holds one (its admit ran), r0's is free
    assert (await store.admit(one, now=T0)).allowed


async def test_riders_fail_when_the_reply_carrying_them_cannot_be_handed_out(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bundle reply that does not match its calls (here no reply at all) fails every rider it carried: none is
    left waiting on a reply that never comes. Before the fix ``deliver`` ran outside the ``try`` that fails the
    riders, so its error left the settlement's caller waiting for ever (bounded only by the writer's deadline)."""
    assert (await store.admit([slot(0)], now=T0)).allowed
    settle = asyncio.ensure_future(store.settle_many([Settlement("s0", slots=(slot(0),))], now=T0))
    await riders_waiting(store, 1)
    bundle = store._bundle

    async def short(*, keys: list[str], args: list[str]) -> list[Any]:
        await bundle(keys=keys, args=args)
        return []  # the calls ran, but no reply can be matched to a rider

    monkeypatch.setattr(store, "_bundle", short)
    with pytest.raises(ValueError, match="shorter than"):
        await store.admit([slot(1)], now=T0)
    async with asyncio.timeout(10):
        with pytest.raises(ValueError, match="shorter than"):
            await settle  # its caller hears the failure (the writer then spools or retries)
