"""Ledger retention (``fleet.store.retention``) on every store (memory, a real Redis, a Redis Cluster): rounds of
traffic and retention keep each tenant's ledger (and, on Redis, its stream) under the size bound, the exports plus
what is left are every record exactly once, totals count what is left, and spend is untouched. A late record
under the cut stops a trim instead of being lost; a run that died between trim and commit is settled."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from fleet.store.ledger_export import PARTIAL, ExportDirectory
from fleet.store.protocol import UsageRecord
from fleet.store.redis import RedisStore
from fleet.store.retention import RetentionPolicy, retain
from tests.fleet.store_harness import T0, StoreHarness

TENANTS = ("acme", "globex")
TIE = 3
"""Records per instant: a page or a cut can fall inside a group of records with the same ``at``."""


def record(round_: int, i: int, *, start: float) -> UsageRecord:
    return UsageRecord(
        request_id=f"r{round_}-{i}-{uuid.uuid4().hex[:6]}", tenant=TENANTS[i % 2], model="m", worker_id="w",
        prompt_tokens=10, completion_tokens=1 + i % 7, cost_usd=0.001, status="ok", at=start + (i // (2 * TIE)),
    )  # fmt: skip


def batch(round_: int, n: int, *, start: float) -> list[UsageRecord]:
    return [record(round_, i, start=start) for i in range(n)]


async def stored(harness: StoreHarness, tenant: str) -> list[UsageRecord]:
    totals = await harness.store.usage(tenant, since=float("-inf"), until=float("inf"), limit=1_000_000)
    assert totals.requests == len(totals.records)
    return list(totals.records)


async def test_size_retention_bounds_each_ledger_while_exports_stay_exact(
    harness: StoreHarness, tmp_path: Path
) -> None:
    store, sink = harness.store, ExportDirectory(tmp_path / "exports")
    bound = 400
    policy = RetentionPolicy(max_records=bound)
    written: dict[str, UsageRecord] = {}
    spent_before = dict.fromkeys(TENANTS, 0.0)
    for round_ in range(4):
        records = batch(round_, 900, start=T0 + 1000 * round_)
        await store.append_usage_many(records)
        written |= {r.request_id: r for r in records}
        report = await retain(store, policy, now=T0 + 1000 * round_ + 500, sink=sink, page=128)
        assert report.skipped == []
        for tenant in TENANTS:
            left = await stored(harness, tenant)
            assert len(left) <= bound + TIE - 1, f"round {round_}: {tenant} holds {len(left)}"
            assert len(left) >= bound, "retention removes only what is over the bound"
            if isinstance(store, RedisStore):
                assert await store.ledger_stream_length(tenant) == len(left), "the stream is trimmed with the index"
    exported = list(sink.records())
    remaining = [r for t in TENANTS for r in await stored(harness, t)]
    exported_ids = [r.request_id for r in exported]
    assert len(exported_ids) == len(set(exported_ids)), "no record exported twice"
    assert set(exported_ids).isdisjoint(r.request_id for r in remaining), "no record both exported and kept"
    assert set(exported_ids) | {r.request_id for r in remaining} == set(written), "no record lost"
    assert all(written[r.request_id] == r for r in exported), "exported records are the records written"
    assert not list((tmp_path / "exports").glob(f"*/*{PARTIAL}"))
    for tenant in TENANTS:
        ordered = [r.at for r in exported if r.tenant == tenant]
        assert ordered == sorted(ordered)
        assert max(ordered) <= min(r.at for r in remaining if r.tenant == tenant)
        spent = await store.spent(f"spend:{tenant}")
        assert spent == pytest.approx(spent_before[tenant] + 0.001 * sum(r.tenant == tenant for r in written.values()))


async def test_age_retention_trims_what_is_older_and_totals_count_what_is_left(harness: StoreHarness) -> None:
    store = harness.store
    records = batch(0, 600, start=T0)
    await store.append_usage_many(records)
    cut = T0 + 20
    report = await retain(store, RetentionPolicy(max_age_s=80), now=cut + 80)
    for tenant in TENANTS:
        kept = [r for r in records if r.tenant == tenant and r.at >= cut]
        assert report.trimmed[tenant] == sum(r.tenant == tenant for r in records) - len(kept)
        totals = await store.usage(tenant, since=float("-inf"), until=float("inf"), limit=0)
        assert totals.requests == len(kept)
        assert totals.completion_tokens == sum(r.completion_tokens for r in kept)
        part = await store.usage(tenant, since=T0, until=cut + 30, limit=0)
        assert part.requests == sum(cut <= r.at < cut + 30 for r in kept)


async def test_a_late_record_under_the_cut_stops_the_trim(harness: StoreHarness) -> None:
    store = harness.store
    records = batch(0, 60, start=T0)
    await store.append_usage_many(records)
    acme = [r for r in records if r.tenant == "acme"]
    under = sum(r.at < T0 + 4 for r in acme)
    assert await store.trim_usage("acme", before=T0 + 4, expected=under - 1) is None
    assert len(await stored(harness, "acme")) == len(acme), "nothing removed"
    assert await store.trim_usage("acme", before=T0 + 4, expected=under) == under
    again = acme[0].model_copy(update={"cost_usd": 0.0})
    await store.append_usage(again)  # its id went with the trim: a replay this late is stored again
    assert len(await stored(harness, "acme")) == len(acme) - under + 1


async def test_recovery_commits_a_trimmed_page_and_discards_an_untrimmed_one(
    harness: StoreHarness, tmp_path: Path
) -> None:
    store, sink = harness.store, ExportDirectory(tmp_path / "exports")
    records = batch(0, 60, start=T0)
    await store.append_usage_many(records)
    acme = [r for r in records if r.tenant == "acme"]
    older, newer = [r for r in acme if r.at < T0 + 2], [r for r in acme if T0 + 2 <= r.at < T0 + 4]
    trimmed = await sink.stage("acme", older)
    assert await store.trim_usage("acme", before=T0 + 2, expected=len(older)) == len(older)
    await sink.stage("acme", newer)  # the run died here, before its trim
    assert await sink.recover(store) == (1, 1)
    assert [r.request_id for r in sink.records()] == [r.request_id for r in older]
    assert not Path(trimmed).exists()  # noqa: ASYNC240
