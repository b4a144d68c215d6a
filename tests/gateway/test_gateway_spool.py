"""The durable usage spool: records the store cannot take survive on disk (a real kill -9 included) and are
replayed in order, once each, when the store is back."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest

from bench.procs import free_port
from fleet.clock import ManualClock, SystemClock
from fleet.store.memory import MemoryStore
from fleet.store.protocol import UsageRecord
from fleet.store.redis import RedisStore
from gateway.settings import GatewaySettings
from gateway.usage.metering import LedgerWriter
from gateway.usage.metrics import GatewayMetrics
from gateway.usage.spool import Spool

from .harness import eventually

T0 = 1_700_000_000.0
MAX_BYTES = GatewaySettings.model_fields["spool_max_bytes"].default
"""The bound a gateway runs with unless configured: where one test does not test the bound."""


def record(i: int, tenant: str = "alpha") -> UsageRecord:
    return UsageRecord(
        request_id=f"req-{i}",
        tenant=tenant,
        model="m",
        worker_id="w0",
        prompt_tokens=10,
        completion_tokens=i,
        cost_usd=0.001 * i,
        status="ok",
        at=T0 + i,
    )


class SwitchableStore(MemoryStore):
    """A memory store whose ledger appends fail while ``down``."""

    def __init__(self) -> None:
        super().__init__(clock=ManualClock(T0))
        self.down = True

    async def append_usage_many(self, records: Sequence[UsageRecord]) -> None:
        if self.down:
            raise ConnectionError("store down")
        await super().append_usage_many(records)


# ------------------------------------------------------------------------------------------------ spool
def test_spooled_records_survive_a_reopen_and_replay_in_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=MAX_BYTES)
    assert spool.append([record(i) for i in range(5)])
    first, end = spool.pending(3)
    assert [r.request_id for r in first] == ["req-0", "req-1", "req-2"]
    spool.commit(end)
    reopened = Spool(tmp_path, max_bytes=MAX_BYTES)  # what a restarted process sees
    rest, end = reopened.pending(100)
    assert [r.request_id for r in rest] == ["req-3", "req-4"]
    reopened.commit(end)
    assert not reopened.has_pending()
    assert reopened.size_bytes() == 0  # drained: the file is emptied


def test_a_line_torn_by_a_crash_is_dropped(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=MAX_BYTES)
    spool.append([record(0), record(1)])
    with (tmp_path / "usage.jsonl").open("ab") as f:
        f.write(record(2).model_dump_json().encode()[:20])  # killed mid-write: never acknowledged
    reopened = Spool(tmp_path, max_bytes=MAX_BYTES)
    records, _ = reopened.pending(100)
    assert [r.request_id for r in records] == ["req-0", "req-1"]
    assert reopened.append([record(3)])
    assert [r.request_id for r in reopened.pending(100)[0]] == ["req-0", "req-1", "req-3"]


def test_a_damaged_line_is_skipped_not_replayed_forever(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = Spool(tmp_path, max_bytes=MAX_BYTES)
    spool.append([record(0)])
    with (tmp_path / "usage.jsonl").open("ab") as f:
        f.write(b"{not json}\n")
    spool.append([record(1)])
    records, end = spool.pending(100)
    assert [r.request_id for r in records] == ["req-0", "req-1"]
    assert "unreadable record" in caplog.text
    spool.commit(end)
    assert not spool.has_pending()


def test_a_full_spool_refuses_and_says_so(tmp_path: Path) -> None:
    one = len(record(0).model_dump_json()) + 1
    spool = Spool(tmp_path, max_bytes=3 * one)
    assert spool.append([record(0), record(1)])
    assert not spool.append([record(2), record(3)])
    assert spool.full
    assert [r.request_id for r in spool.pending(100)[0]] == ["req-0", "req-1"]
    spool.commit(spool.pending(100)[1])
    assert not spool.full


# ----------------------------------------------------------------------------------------- ledger writer
async def test_an_outage_spools_records_and_the_writer_replays_them_once(tmp_path: Path) -> None:
    store, metrics = SwitchableStore(), GatewayMetrics()
    writer = LedgerWriter(
        store, clock=SystemClock(), metrics=metrics, spool=Spool(tmp_path, max_bytes=MAX_BYTES), retry_s=0.01
    )
    writer.start()
    for i in range(10):
        writer.append(record(i, tenant="alpha" if i % 2 else "beta"))
    async with asyncio.timeout(5):
        await writer.idle()  # every record is in the spool: nothing waits in memory
    assert metrics.store_up._value.get() == 0
    assert metrics.spool_bytes._value.get() > 0
    writer.append(record(10))  # behind the spooled ones
    store.down = False

    async def replayed() -> bool:
        return len(await store.ledger(since=0, until=1e12)) == 11 and metrics.spool_bytes._value.get() == 0

    await eventually(replayed)
    await writer.close()
    ids = [r.request_id for r in await store.ledger(since=0, until=1e12)]
    assert ids == [f"req-{i}" for i in range(11)]
    assert metrics.store_up._value.get() == 1


async def test_close_spools_what_is_still_in_memory(tmp_path: Path) -> None:
    store = SwitchableStore()
    writer = LedgerWriter(store, clock=SystemClock(), metrics=GatewayMetrics(), spool=None)
    writer.start()
    writer.append(record(0))
    await writer.close(drain_s=0.05)  # no spool: the record is lost, and said so
    spooled = LedgerWriter(
        store, clock=SystemClock(), metrics=GatewayMetrics(), spool=Spool(tmp_path, max_bytes=MAX_BYTES)
    )
    for i in range(3):
        spooled.append(record(i))
    await spooled.close(drain_s=0.0)  # never started: everything is still queued in memory
    assert [r.request_id for r in Spool(tmp_path, max_bytes=MAX_BYTES).pending(100)[0]] == ["req-0", "req-1", "req-2"]


_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from fleet.clock import SystemClock
    from fleet.store.redis import RedisStore
    from gateway.usage.metering import LedgerWriter
    from gateway.usage.metrics import GatewayMetrics
    from gateway.usage.spool import Spool
    from tests.gateway.test_gateway_spool import MAX_BYTES, record

    async def main() -> None:
        store = RedisStore.from_url(sys.argv[2], wait_s=0.2)  # nothing listens there: an outage
        spool = Spool(Path(sys.argv[1]), max_bytes=MAX_BYTES)
        writer = LedgerWriter(store, clock=SystemClock(), metrics=GatewayMetrics(), spool=spool)
        writer.start()
        for i in range(50):
            writer.append(record(i, tenant="alpha" if i % 3 else "beta"))
        await writer.idle()
        print("spooled", flush=True)
        await asyncio.sleep(60)

    asyncio.run(main())
    """
)


@pytest.mark.redis
async def test_a_kill_9_during_an_outage_loses_nothing_spooled(tmp_path: Path, redis_url: str) -> None:
    argv = [sys.executable, "-c", _CHILD, str(tmp_path), f"redis://127.0.0.1:{free_port()}/0"]
    child = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    try:
        assert child.stdout is not None
        assert (await asyncio.wait_for(child.stdout.readline(), 30)).strip() == b"spooled"
    finally:
        child.kill()  # SIGKILL: no shutdown drain
        await child.wait()
    store = RedisStore.from_url(redis_url, prefix=f"spool-{free_port()}:")
    try:
        await store.append_usage_many([record(1, tenant="alpha"), record(2, tenant="alpha")])  # stored, not committed
        settings = GatewaySettings(spool_dir=tmp_path)
        assert settings.spool_dir is not None
        metrics = GatewayMetrics()
        writer = LedgerWriter(
            store,
            clock=SystemClock(),
            metrics=metrics,
            spool=Spool(settings.spool_dir, max_bytes=settings.spool_max_bytes),
        )
        writer.start()

        async def replayed() -> bool:
            return len(await store.ledger(since=0, until=1e12)) == 50 and metrics.spool_bytes._value.get() == 0

        await eventually(replayed, timeout_s=10)
        await writer.close()
        ledger = await store.ledger(since=0, until=1e12, limit=1000)
        assert sorted(r.request_id for r in ledger) == sorted(f"req-{i}" for i in range(50))  # each exactly once
        assert [r.at for r in ledger] == sorted(r.at for r in ledger)
    finally:
        await store.close()
