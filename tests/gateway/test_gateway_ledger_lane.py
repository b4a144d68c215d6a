"""The ledger writer's lanes never stop silently (issue 23, "nothing lost": the disconnects fault of
``gearshift bench chaos --fast`` lost the answered records of a restarted gateway, its records lane stuck).

The cause: on Redis Cluster, an ``admit_many`` of several tenants took the riders waiting for an admit of its first
tenant (``fleet.store.rides``) and then sent the tenants' scripts pipelined, without them: no reply ever reached
those riders (a ledger append, a settlement), and the lane awaiting one waited forever. Beyond that cause, a lane
gives every store write a deadline (``GatewaySettings.store_timeout_s``) and survives an unexpected error of its
own steps: logged, the entries kept (spooled or retried)."""

from __future__ import annotations

import asyncio
import math
import uuid
from pathlib import Path

import pytest

from fleet.clock import SystemClock
from fleet.store.protocol import Settlement, SlotLimit, UsageRecord, WindowLimit
from fleet.store.redis import RedisStore
from gateway.usage.metering import LedgerWriter
from gateway.usage.metrics import GatewayMetrics
from gateway.usage.spool import Journal, Spool

T0 = 1_700_000_000.0
MAX_BYTES = 64 * 1024 * 1024


def record(i: int, tenant: str = "acme") -> UsageRecord:
    return UsageRecord(request_id=f"req-{i}", tenant=tenant, model="m", worker_id="w0", prompt_tokens=10,
                       completion_tokens=i, cost_usd=0.001 * i, status="ok", at=T0 + i)  # fmt: skip


def prefix() -> str:
    """A key prefix of this test's own on the shared cluster."""
    return f"test:{uuid.uuid4().hex[:12]}:"


def rpm(tenant: str) -> list[WindowLimit]:
    return [WindowLimit(key=f"rpm:{tenant}", cost=1, limit=1000)]


async def riders_waiting(store: RedisStore, n: int) -> None:
    for _ in range(1000):
        if len(store._rides.waiting) >= n:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{len(store._rides.waiting)} riders wait, expected {n}")


# ------------------------------------------------------------------------------------------------ the cause
@pytest.mark.redis
@pytest.mark.cluster
async def test_a_cluster_admit_of_several_tenants_leaves_no_rider_unanswered(
    redis_cluster_url: str,
) -> None:
    """A ledger append and a settlement wait for an admit of their tenant; the next admit is an ``admit_many`` of
    two tenants (a tick's batch). Both calls finish (carried, or alone once their wait is over) and land."""
    store = RedisStore.from_url(redis_cluster_url, prefix=prefix(), cluster=True, server_clock=False, ride_s=1.0)
    await store.verify()
    try:
        slot = SlotLimit(key="concurrency:acme", slot_id="r0", limit=1)
        assert (await store.admit([slot], now=T0)).allowed  # admits flow: the next calls wait for one
        append = asyncio.ensure_future(store.append_usage_many([record(0)]))
        settle = asyncio.ensure_future(store.settle_many([Settlement("s0", slots=(slot,))], now=T0))
        await riders_waiting(store, 2)
        assert len(store._rides.waiting) == 2  # still waiting as the batch goes (no await in between)
        admits = await store.admit_many([(rpm("acme"), T0), (rpm("other"), T0)])
        assert all(a.allowed for a in admits)
        async with asyncio.timeout(10):  # stuck forever without the fix
            await asyncio.gather(append, settle)
        assert (await store.usage("acme", since=0, until=math.inf)).requests == 1
        again = SlotLimit(key="concurrency:acme", slot_id="r1", limit=1)
        assert (await store.admit([again], now=T0)).allowed  # r0's slot was released
    finally:
        await store.close()


@pytest.mark.redis
@pytest.mark.cluster
async def test_the_records_lane_keeps_writing_across_a_batch_of_several_tenants(
    redis_cluster_url: str, tmp_path: Path
) -> None:
    """The lane as the gateway runs it (spool, journal, lingering) on the cluster: a record waits for an admit
    while a batch of two tenants' admits goes; that record and the ones after it all land, and the journal empties."""
    store = RedisStore.from_url(redis_cluster_url, prefix=prefix(), cluster=True, server_clock=False, ride_s=1.0)
    await store.verify()
    spool, journal = Spool(tmp_path, max_bytes=MAX_BYTES), Journal(tmp_path)
    writer = LedgerWriter(store, clock=SystemClock(), metrics=GatewayMetrics(), spool=spool, journal=journal)
    writer.start()
    try:
        assert (await store.admit(rpm("acme"), now=T0)).allowed
        writer.write(record(0), None)
        await riders_waiting(store, 1)
        await store.admit_many([(rpm("acme"), T0), (rpm("other"), T0)])
        for i in range(1, 4):
            writer.write(record(i), None)
        async with asyncio.timeout(10):
            await writer.idle()
        assert (await store.usage("acme", since=0, until=math.inf)).requests == 4
        assert journal.outstanding() == 0
    finally:
        await writer.close()
        await store.close()
