"""Defect 9 (issue 23): limit exactness must not depend on the gateway replicas' clocks. Two replicas share one
real Redis; one replica's clock runs ``SKEW_S`` ahead. The limits' time is Redis's own (``TIME`` inside the
scripts), so the skewed replica sees the same windows, slots and replica registry as the other one.

Before the fix the scripts used the caller's ``now``: the fast replica found the other's units already out of the
window (and deleted them), the other's concurrency slot expired, and the other replica missing from the registry,
so it admitted twice the limit and enforced twice its share during an outage."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest

from fleet.store.protocol import SlotLimit, WindowLimit
from fleet.store.redis import RedisStore

pytestmark = pytest.mark.redis

SKEW_S = 2.5
"""How far the fast replica's clock is ahead, seconds: more than the short windows and TTLs below."""
WINDOW_S = 2.0
LIMIT = 5


@pytest.fixture(params=["redis", pytest.param("cluster", marks=pytest.mark.cluster)])
async def replicas(request: pytest.FixtureRequest) -> AsyncIterator[tuple[RedisStore, RedisStore]]:
    """Two replicas' stores on the session's Redis, or on its Redis Cluster (where ``TIME`` runs inside scripts
    that keep to one slot)."""
    cluster = request.param == "cluster"
    url = request.getfixturevalue("redis_cluster_url" if cluster else "redis_url")
    prefix = f"skew-{uuid.uuid4().hex[:8]}:"
    pair = (
        RedisStore.from_url(url, prefix=prefix, cluster=cluster),
        RedisStore.from_url(url, prefix=prefix, cluster=cluster),
    )
    for store in pair:
        await store.verify()
    yield pair
    for store in pair:
        await store.close()


def _slow_now() -> float:
    return time.time()


def _fast_now() -> float:
    return time.time() + SKEW_S


async def test_a_replica_ahead_in_time_admits_no_more_than_the_limit(replicas: tuple[RedisStore, RedisStore]) -> None:
    slow, fast = replicas
    rpm = WindowLimit(key="rpm:acme", cost=1, limit=LIMIT, window_s=WINDOW_S)
    admitted = [(await slow.admit([rpm], now=_slow_now())).allowed for _ in range(LIMIT)]
    admitted += [(await fast.admit([rpm], now=_fast_now())).allowed for _ in range(LIMIT)]
    assert sum(admitted) == LIMIT
    refusal = await fast.admit([rpm], now=_fast_now())
    assert not refusal.allowed
    assert 0 < refusal.retry_after_s <= WINDOW_S * 1.02  # measured on the server's clock, not the caller's


async def test_a_replica_ahead_in_time_keeps_the_others_concurrency_slot(
    replicas: tuple[RedisStore, RedisStore],
) -> None:
    slow, fast = replicas

    def slot(slot_id: str) -> SlotLimit:
        return SlotLimit(key="concurrency:acme", slot_id=slot_id, limit=1, ttl_s=2.0)

    assert (await slow.admit([slot("a")], now=_slow_now())).allowed
    assert not (await fast.admit([slot("b")], now=_fast_now())).allowed


async def test_a_replica_ahead_in_time_still_counts_the_other_replica(replicas: tuple[RedisStore, RedisStore]) -> None:
    slow, fast = replicas
    assert await slow.replica_heartbeat("slow", ttl_s=2.0, now=_slow_now()) == 1
    assert await fast.replica_heartbeat("fast", ttl_s=2.0, now=_fast_now()) == 2


async def test_a_refund_from_a_replica_ahead_in_time_lowers_its_own_reservation(
    replicas: tuple[RedisStore, RedisStore],
) -> None:
    """The refund's ``reserved_at`` is on the caller's clock: the store measures the reservation's age on that
    clock, so the refund finds the reservation's bucket on the server's clock."""
    slow, fast = replicas
    tpm = WindowLimit(key="tpm:acme", cost=1000, limit=1000, window_s=60.0)
    reserved_at = _fast_now()
    assert (await fast.admit([tpm], now=reserved_at)).allowed
    refund = WindowLimit(key="tpm:acme", cost=-1000, limit=1000, window_s=60.0, reserved_at=reserved_at)
    await fast.settle(windows=[refund], slots=[], spend={}, now=_fast_now())
    assert (await slow.admit([tpm], now=_slow_now())).allowed
