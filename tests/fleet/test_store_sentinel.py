"""Redis Sentinel on loopback (a primary, one replica, one Sentinel, all started here): the store finds the primary
through the Sentinel, a ledger write waits for the replica (``WAIT``), and after the primary is killed the store
reaches the promoted replica by itself; the time without a store and the over-admission are measured."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import pytest

from bench.procs import start_redis_sentinel
from fleet.config import CommonSettings
from fleet.store.factory import build_store
from fleet.store.protocol import SlotLimit, UsageRecord, WindowLimit
from fleet.store.redis import RedisStore, sentinel_addresses

pytestmark = [pytest.mark.redis, pytest.mark.slow]

LIMIT = 400
BEFORE_KILL = 150
DEADLINE_S = 30.0
"""Bound on the failover (the Sentinel judges the primary down after 1 s, then promotes the replica)."""


def _record(i: int) -> UsageRecord:
    return UsageRecord(
        request_id=f"r{i}", tenant="acme", model="m", worker_id=None, prompt_tokens=1, completion_tokens=1,
        cost_usd=0.5, status="ok", at=time.time(),
    )  # fmt: skip


def test_sentinel_addresses_are_parsed_and_bad_ones_named() -> None:
    assert sentinel_addresses("10.0.0.1:26379, sentinel-b:26380") == [("10.0.0.1", 26379), ("sentinel-b", 26380)]
    with pytest.raises(ValueError, match="GEARSHIFT_REDIS_SENTINELS"):
        sentinel_addresses("10.0.0.1")


async def test_the_store_follows_the_sentinels_primary_through_a_failover(tmp_path: Path) -> None:
    setup = start_redis_sentinel(log_dir=tmp_path)
    settings = CommonSettings(
        redis_url="redis://ignored:1/0", redis_sentinels=setup.addresses, redis_sentinel_master=setup.master,
        key_prefix="sentinel:", redis_wait_replicas=1,
    )  # fmt: skip
    store = build_store(settings)
    assert isinstance(store, RedisStore)
    limit = WindowLimit(key="rpm:acme", cost=1, limit=LIMIT, window_s=60.0)
    try:
        await store.verify()
        assert (await store.admit([SlotLimit(key="concurrency:acme", slot_id="a", limit=1)], now=time.time())).allowed
        await store.append_usage_many([_record(0), _record(0)])  # returns once the replica has it
        assert await store.spent("spend:acme") == 0.5
        admitted = sum([(await store.admit([limit], now=time.time())).allowed for _ in range(BEFORE_KILL)])
        assert admitted == BEFORE_KILL
        setup.primary.kill()
        killed_at = time.monotonic()
        failures, back_at = 0, None
        while back_at is None and time.monotonic() - killed_at < DEADLINE_S:
            try:
                admitted += (await store.admit([limit], now=time.time())).allowed
                back_at = time.monotonic()
            except Exception:  # no primary yet: the gateway fails open or closed meanwhile
                failures += 1
                await asyncio.sleep(0.05)
        assert back_at is not None, f"no admission {DEADLINE_S} s after the primary died"
        while (await store.admit([limit], now=time.time())).allowed:
            admitted += 1
            assert admitted <= 2 * LIMIT
        totals = await store.usage("acme", since=0, until=math.inf)
        print(f"sentinel failover: {back_at - killed_at:.2f} s without a store ({failures} failed calls); "
              f"over-admission {admitted - LIMIT}")  # fmt: skip
        assert 0 <= admitted - LIMIT <= BEFORE_KILL  # at most what the dead primary had not replicated
        assert totals.requests == 1, "the record acknowledged by the replica (WAIT) survived the failover"
    finally:
        await store.close()
        setup.stop()
