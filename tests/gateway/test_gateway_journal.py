"""The usage journal (``gateway.usage.spool.Journal``, chaos defect 2 of issue 23): an answered request's record is
on disk before the client sees the end of the answer, and the next process on the spool directory writes what a
killed one left, once."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import orjson
import pytest

from fleet.clock import ManualClock, SystemClock
from fleet.store.memory import MemoryStore
from fleet.store.protocol import UsageRecord
from gateway.usage.metering import LedgerWriter
from gateway.usage.metrics import GatewayMetrics
from gateway.usage.spool import Journal, Spool

from .harness import MODEL, StartUpstreams, eventually, make_fleet, make_tenants, serve_gateway
from .test_gateway_spool import MAX_BYTES, T0, record


class HeldStore(MemoryStore):
    """A memory store whose ledger appends wait until ``release`` is set (a store that does not answer yet)."""

    def __init__(self) -> None:
        super().__init__(clock=ManualClock(T0))
        self.release = asyncio.Event()

    async def append_usage_many(self, records: Sequence[UsageRecord]) -> None:
        await self.release.wait()
        await super().append_usage_many(records)


def on_disk(directory: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file())


def journal_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("journal.*.jsonl"))


# ---------------------------------------------------------------------------------- before the answer's end
async def test_the_record_is_on_disk_before_the_client_sees_done(tmp_path: Path, upstreams: StartUpstreams) -> None:
    (worker,) = await upstreams(1, chunks=4)
    store = HeldStore()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with serve_gateway(make_fleet([worker.url]), make_tenants(), store=store, spool_dir=tmp_path) as g:
        try:
            async with g.client() as c, c.stream("POST", "/v1/chat/completions", json=body) as resp:
                rid = resp.headers["x-request-id"].encode()
                seen_at_done = None
                async for line in resp.aiter_lines():
                    if line == "data: [DONE]":
                        seen_at_done = on_disk(tmp_path)
            assert seen_at_done is not None
            assert rid in seen_at_done  # the store has not answered: only the journal can hold it
            async with g.client() as c:  # a whole answer: on disk before its body is sent
                whole = await c.post("/v1/chat/completions", json={**body, "stream": False})
                assert whole.status_code == 200
                assert whole.headers["x-request-id"].encode() in on_disk(tmp_path)
        finally:
            store.release.set()
    ids = {r.request_id.encode() for r in await store.ledger(since=0, until=1e12)}
    assert ids == {rid, whole.headers["x-request-id"].encode()}
    assert b"".join((tmp_path / f).read_bytes() for f in journal_files(tmp_path)) == b""  # forgotten once stored


# ----------------------------------------------------------------------------------------------- journal
def test_a_record_is_forgotten_once_done_and_the_file_emptied(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    for i in range(3):
        journal.append(record(i))
    (name,) = journal_files(tmp_path)
    assert len((tmp_path / name).read_bytes().splitlines()) == 3
    journal.done(2)
    assert journal.outstanding() == 1
    assert len((tmp_path / name).read_bytes().splitlines()) == 3  # the oldest two are done, the file still needed
    journal.done(1)
    assert (tmp_path / name).read_bytes() == b""
    journal.append(record(3))
    assert [orjson.loads(line)["request_id"] for line in (tmp_path / name).read_bytes().splitlines()] == ["req-3"]
    journal.close()


def test_what_a_killed_process_journaled_is_recovered_in_order(tmp_path: Path) -> None:
    killed = Journal(tmp_path)
    for i in range(4):
        killed.append(record(i))
    killed.done(1)  # req-0 reached the store; the process dies without closing anything
    with (tmp_path / journal_files(tmp_path)[-1]).open("ab") as f:
        f.write(record(9).model_dump_json().encode()[:25])  # killed mid-write: its answer never ended
    after = Journal(tmp_path)
    # req-0 comes back too: done was only in memory, the store skips a request id it has (Store.append_usage_many)
    assert [r.request_id for r in after.recovered()] == ["req-0", "req-1", "req-2", "req-3"]
    assert after.recovered() == []  # given once
    after.append(record(4))
    assert after.outstanding() == 5
    after.done(4)  # the recovered ones: their segment goes
    assert len(journal_files(tmp_path)) == 1
    after.done(1)
    assert on_disk(tmp_path).count(b"req-") == 0
    after.close()


def test_a_segment_past_its_bound_is_dropped_once_its_records_are_done(tmp_path: Path) -> None:
    one = len(record(0).model_dump_json()) + 1
    journal = Journal(tmp_path, segment_bytes=2 * one)
    for i in range(5):  # the writer never catches up completely: 2 + 2 + 1
        journal.append(record(i))
    assert len(journal_files(tmp_path)) == 3
    journal.done(3)
    assert len(journal_files(tmp_path)) == 2  # the first is wholly done
    journal.done(2)
    assert len(journal_files(tmp_path)) == 1
    assert on_disk(tmp_path).count(b"req-") == 0
    journal.close()


# ------------------------------------------------------------------------------------------ ledger writer
async def test_the_next_writer_stores_what_a_killed_one_journaled_exactly_once(tmp_path: Path) -> None:
    held = HeldStore()
    killed = LedgerWriter(held, clock=SystemClock(), metrics=GatewayMetrics(), journal=Journal(tmp_path))
    killed.start()
    for i in range(5):
        killed.write(record(i), None)
    store = MemoryStore(clock=ManualClock(T0))
    await store.append_usage_many([record(0)])  # reached the store just before the kill
    for task in killed._tasks:  # the kill: nothing is drained, spooled or closed
        task.cancel()
    writer = LedgerWriter(
        store, clock=SystemClock(), metrics=GatewayMetrics(), spool=Spool(tmp_path, max_bytes=MAX_BYTES),
        journal=Journal(tmp_path),
    )  # fmt: skip
    writer.start()
    writer.write(record(5), None)

    async def stored() -> bool:
        return len(await store.ledger(since=0, until=1e12)) == 6

    await eventually(stored)
    await writer.close()
    assert [r.request_id for r in await store.ledger(since=0, until=1e12)] == [f"req-{i}" for i in range(6)]
    assert on_disk(tmp_path).count(b"req-") == 0


async def test_a_store_outage_moves_the_records_to_the_spool_and_out_of_the_journal(tmp_path: Path) -> None:
    from .test_gateway_spool import SwitchableStore

    store = SwitchableStore()  # down
    spool, journal = Spool(tmp_path, max_bytes=MAX_BYTES), Journal(tmp_path)
    writer = LedgerWriter(store, clock=SystemClock(), metrics=GatewayMetrics(), spool=spool, journal=journal)
    writer.start()
    for i in range(3):
        writer.write(record(i), None)
    async with asyncio.timeout(5):
        await writer.idle()
    assert journal.outstanding() == 0  # the fsynced spool has them
    assert [r.request_id for r in spool.pending(100)[0]] == ["req-0", "req-1", "req-2"]
    store.down = False
    await eventually(lambda: not spool.has_pending())
    await writer.close()
    assert [r.request_id for r in await store.ledger(since=0, until=1e12)] == ["req-0", "req-1", "req-2"]


def test_a_record_costs_one_write_and_no_fsync_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Counter[str] = Counter()
    write, fsync = os.write, os.fsync

    def counted_write(fd: int, data: memoryview) -> int:
        calls["write"] += 1
        return write(fd, data)

    def counted_fsync(fd: int) -> None:
        calls["fsync"] += 1
        fsync(fd)

    monkeypatch.setattr(os, "write", counted_write)
    monkeypatch.setattr(os, "fsync", counted_fsync)
    buffered = Journal(tmp_path / "buffered")
    for i in range(10):
        buffered.append(record(i))
    assert calls == {"write": 10}
    calls.clear()
    synced = Journal(tmp_path / "synced", fsync=True)  # GEARSHIFT_LEDGER_JOURNAL_FSYNC
    for i in range(10):
        synced.append(record(i))
    assert calls["write"] == 10
    assert calls["fsync"] == 10 + 1  # one per record, and the directory once for the new segment
    buffered.close()
    synced.close()
