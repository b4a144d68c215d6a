"""The ledger writer's lanes never stop silently (issue 23, "nothing lost": the disconnects fault of
``gearshift bench chaos --fast`` lost the answered records of a restarted gateway, its records lane stuck).

The cause: on Redis Cluster, an ``admit_many`` of several tenants took the riders waiting for an admit of its first
tenant (``fleet.store.rides``) and then sent the tenants' scripts pipelined, without them: no reply ever reached
those riders (a ledger append, a settlement), and the lane awaiting one waited forever. Beyond that cause, a lane
gives every store write a deadline (``GatewaySettings.store_timeout_s``) and survives an unexpected error of its
own steps: logged, the entries kept (spooled or retried)."""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from fleet.clock import ManualClock, SystemClock
from fleet.store.memory import MemoryStore
from fleet.store.protocol import Settlement, SlotLimit, UsageRecord, WindowLimit
from fleet.store.redis import RedisStore
from gateway.intake.admission import Admitter
from gateway.settings import GatewaySettings
from gateway.usage.metering import LedgerWriter
from gateway.usage.metrics import GatewayMetrics
from gateway.usage.spool import Journal, Spool

from .harness import eventually
from .test_gateway_spool import SwitchableStore

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


# ------------------------------------------------------------------------------------- a write's deadline
class StallingStore:
    """A shared store (not in this process: ``fleet.store.memory.in_process`` is false) whose first ``stalls`` ledger
    appends and settlements never answer (a lost reply, a frozen node); then it answers like a memory store."""

    def __init__(self, *, stalls: int = 1) -> None:
        self.inner = MemoryStore(clock=ManualClock(T0))
        self.stalls = {"append": stalls, "settle": stalls}
        self.settled: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def _stall(self, what: str) -> None:
        if self.stalls[what]:
            self.stalls[what] -= 1
            await asyncio.Event().wait()

    async def append_usage_many(self, records: Sequence[UsageRecord]) -> None:
        await self._stall("append")
        await self.inner.append_usage_many(records)

    async def settle_many(self, settlements: Sequence[Settlement], *, now: float) -> None:
        await self._stall("settle")
        await self.inner.settle_many(settlements, now=now)
        self.settled += [s.settle_id for s in settlements]


async def ledger_ids(store: StallingStore) -> list[str]:
    return [r.request_id for r in await store.inner.ledger(since=0, until=1e12)]


@pytest.mark.parametrize("spooled", [True, False], ids=["spooled", "in-memory"])
async def test_a_write_the_store_never_answers_is_given_up_at_the_store_timeout_and_kept(
    tmp_path: Path, spooled: bool
) -> None:
    store = StallingStore()
    metrics = GatewayMetrics()
    writer = LedgerWriter(
        cast(Any, store), clock=SystemClock(), metrics=metrics, retry_s=0.01, store_timeout_s=0.05,
        spool=Spool(tmp_path, max_bytes=MAX_BYTES) if spooled else None, journal=Journal(tmp_path),
    )  # fmt: skip
    writer.start()
    try:
        writer.write(record(0), Settlement("s0"))
        writer.write(record(1), None)
        async with asyncio.timeout(10):  # forever without a deadline
            await writer.idle()
            await eventually(lambda: len(store.settled) == 1)
            await eventually(lambda: store.stalls["append"] == 0)
        await eventually(lambda: _has(store, 2), timeout_s=10)
        assert await ledger_ids(store) == ["req-0", "req-1"]
        assert store.settled == ["s0"]
        assert metrics.loop_errors.labels(loop="ledger")._value.get() >= 1
    finally:
        await writer.close()


async def _has(store: StallingStore, n: int) -> bool:
    return len(await ledger_ids(store)) == n


async def test_the_gateways_writer_takes_its_deadline_from_the_store_timeout_setting(tmp_path: Path) -> None:
    store = StallingStore()
    settings = GatewaySettings(store_timeout_s=0.05, spool_dir=tmp_path)
    clock = SystemClock()
    admitter = Admitter(cast(Any, store), clock=clock, metrics=GatewayMetrics())
    writer = LedgerWriter.from_settings(
        cast(Any, store), clock=clock, metrics=GatewayMetrics(), settings=settings, admitter=admitter
    )
    writer.start()
    try:
        writer.write(record(0), None)
        await eventually(lambda: _has(store, 1), timeout_s=10)
    finally:
        await writer.close()


# ---------------------------------------------------------------------------------- an error of its own
class FailingSpool(Spool):
    """A spool whose disk fails: every append raises."""

    def append(self, records: Sequence[UsageRecord]) -> bool:
        raise OSError(5, "Input/output error")


@pytest.mark.parametrize("failing", ["landed", "journal", "spool"])
async def test_a_lane_survives_an_error_of_its_own_steps_logs_it_and_keeps_the_entries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, failing: str
) -> None:
    """``landed`` (the admitter's accounting) raising once, the journal failing to forget, the spool's disk failing
    while the store is down: the error is logged with its traceback, and every record lands."""
    store = SwitchableStore() if failing == "spool" else MemoryStore(clock=ManualClock(T0))
    calls: list[int] = []

    def landed(records: Sequence[UsageRecord]) -> None:
        calls.append(len(records))
        if failing == "landed" and len(calls) == 1:
            raise RuntimeError("accounting defect")

    journal = Journal(tmp_path)
    if failing == "journal":
        done = journal.done

        def failing_done(n: int) -> None:
            if not calls or len(calls) == 1:
                raise OSError(5, "Input/output error")
            done(n)

        journal.done = failing_done  # type: ignore[method-assign]
    spool = FailingSpool(tmp_path, max_bytes=MAX_BYTES) if failing == "spool" else None
    writer = LedgerWriter(store, clock=SystemClock(), metrics=GatewayMetrics(), usage_landed=landed, retry_s=0.01,
                          spool=spool, journal=journal)  # fmt: skip
    writer.start()
    try:
        with caplog.at_level(logging.ERROR, logger="gateway.usage.metering"):
            writer.write(record(0), None)
            await eventually(lambda: any(r.exc_info for r in caplog.records), timeout_s=10)
            if isinstance(store, SwitchableStore):
                store.down = False
            for i in range(1, 3):
                writer.write(record(i), None)
            async with asyncio.timeout(10):  # the lane died at the first error without the guard
                await writer.idle()
        assert [r.request_id for r in await store.ledger(since=0, until=1e12)] == ["req-0", "req-1", "req-2"]
        assert all(not t.done() for t in writer._tasks)
    finally:
        await writer.close()
