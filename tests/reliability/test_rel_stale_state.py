"""Defect 6 (issue 23): worker state must not freeze during a store outage. A gateway's worker pool on a real Redis
that then stops: a state published before the outage counts only while it is younger than
``worker_state_max_age_s`` (``WorkerState.updated_at``), so a worker last seen full gets its headroom back from its
own health checks instead of showing none for the whole outage. Before the fix the last state read stayed in force
as long as the store was away."""

from __future__ import annotations

import pytest

from fleet.clock import ManualClock
from fleet.store.protocol import WorkerState
from fleet.store.redis import RedisStore
from gateway.routing.pool import WorkerPool
from gateway.usage.metrics import GatewayMetrics
from tests.gateway.harness import make_fleet, make_settings

from .rel_types import StartRedis

pytestmark = pytest.mark.redis


async def test_a_state_older_than_its_max_age_stops_counting_while_the_store_is_away(own_redis: StartRedis) -> None:
    redis = own_redis(persist=False)
    store = RedisStore.from_url(redis.url, prefix="stale:", wait_s=0.5)
    clock = ManualClock()
    settings = make_settings()
    pool = WorkerPool(
        fleet=make_fleet(["http://127.0.0.1:1"]), store=store, clock=clock, settings=settings, metrics=GatewayMetrics()
    )
    try:
        full = WorkerState(worker_id="w0", model="m", k_desired=0, k_applied=0, accepted_length=1.0, running=32,
                           waiting=50, kv_usage=0.99, overloaded=True, updated_at=clock.wall())  # fmt: skip
        await store.publish_worker_state(full, ttl_s=3600.0)
        await pool.refresh_shared()
        assert pool.views["w0"].state is not None
        assert redis.terminate() == 0
        clock.advance(settings.worker_state_max_age_s / 2)
        with pytest.raises(Exception):  # noqa: B017, PT011  # the store is away: the loop counts the failure
            await pool.refresh_shared()
        assert pool.views["w0"].state is not None, "young enough: still counts"
        clock.advance(settings.worker_state_max_age_s)
        with pytest.raises(Exception):  # noqa: B017, PT011
            await pool.refresh_shared()
        assert pool.views["w0"].state is None, "older than its max age: no longer counts"
    finally:
        await store.close()
