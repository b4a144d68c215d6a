"""Fixtures of the fleet tests: a ``Store`` harness parametrised over both implementations."""

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


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def harness(request: pytest.FixtureRequest, key_prefix: str) -> AsyncIterator[StoreHarness]:
    clock = ManualClock(T0)
    if request.param == "memory":
        store: Store = MemoryStore(clock=clock)
    else:
        store = RedisStore.from_url(request.getfixturevalue("redis_url"), prefix=key_prefix)
    yield StoreHarness(kind=request.param, store=store, clock=clock)
    await store.close()
