"""Fixtures of the fleet tests: a ``Store`` harness parametrised over memory, a single Redis and a Redis Cluster."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from fleet.clock import ManualClock
from fleet.store.memory import MemoryStore
from fleet.store.protocol import Store
from fleet.store.redis import RedisStore
from tests.fleet.store_harness import T0, StoreHarness


@pytest.fixture
def key_prefix() -> str:
    return f"test:{uuid.uuid4().hex[:12]}:"


REDIS_KINDS = [
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("cluster", marks=[pytest.mark.redis, pytest.mark.cluster]),
]
"""The Redis deployments a Redis test runs against: one ``redis-server``, and a 3-master Redis Cluster."""


async def redis_store(request: pytest.FixtureRequest, kind: str, prefix: str) -> RedisStore:
    """A verified ``RedisStore`` on the session's single Redis (``kind`` ``redis``) or Redis Cluster (``cluster``),
    its limits on the caller's ``now`` (the contract tests drive virtual time; tests/reliability/test_rel_clock_skew
    covers the server's clock)."""
    if kind == "cluster":
        url = request.getfixturevalue("redis_cluster_url")
        store = RedisStore.from_url(url, prefix=prefix, cluster=True, server_clock=False)
    else:
        store = RedisStore.from_url(request.getfixturevalue("redis_url"), prefix=prefix, server_clock=False)
    await store.verify()
    return store


@pytest.fixture(params=REDIS_KINDS)
def redis_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["memory", *REDIS_KINDS])
async def harness(request: pytest.FixtureRequest, key_prefix: str) -> AsyncIterator[StoreHarness]:
    clock = ManualClock(T0)
    if request.param == "memory":
        store: Store = MemoryStore(clock=clock)
    else:
        store = await redis_store(request, request.param, key_prefix)
    yield StoreHarness(kind=request.param, store=store, clock=clock)
    await store.close()
