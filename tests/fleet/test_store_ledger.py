"""The ledger's roll-ups: totals over any range equal the sum of the records in it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.store.ledger import TenantLedger
from fleet.store.protocol import UsageRecord
from tests.fleet.store_harness import T0

DAY_S = 86_400.0


def make_record(i: int, at: float, cost: float) -> UsageRecord:
    return UsageRecord(
        request_id=f"r{i}",
        tenant="t",
        model="m",
        worker_id=None,
        prompt_tokens=i % 97,
        completion_tokens=(7 * i) % 113,
        cost_usd=cost,
        status="ok",
        at=at,
    )


offsets = st.floats(min_value=0.0, max_value=3 * DAY_S, allow_nan=False)
bounds = st.one_of(offsets.map(lambda x: T0 + x), st.sampled_from([0.0, float("inf"), T0, T0 + 3600.0]))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(offsets, st.floats(min_value=0.0, max_value=5.0)), max_size=60),
    st.lists(st.tuples(bounds, bounds), min_size=1, max_size=5),
)
def test_rollup_totals_equal_the_sum_of_records(
    plan: list[tuple[float, float]], ranges: list[tuple[float, float]]
) -> None:
    ledger = TenantLedger()
    records = [make_record(i, T0 + offset, cost) for i, (offset, cost) in enumerate(plan)]
    for r in records:
        ledger.append(r)
    for since, until in ranges:
        chosen = sorted((r for r in records if since <= r.at < until), key=lambda r: (r.at, r.model_dump_json()))
        totals = ledger.usage(since, until, limit=10)
        assert totals.requests == len(chosen)
        assert totals.prompt_tokens == sum(r.prompt_tokens for r in chosen)
        assert totals.completion_tokens == sum(r.completion_tokens for r in chosen)
        assert totals.cost_usd == pytest.approx(sum(r.cost_usd for r in chosen), rel=1e-9, abs=1e-12)
        assert list(totals.records) == chosen[:10]


def test_a_month_reads_rollups_not_records() -> None:
    ledger = TenantLedger()
    for i in range(2000):
        ledger.append(make_record(i, T0 + i * 1300.0, 0.01))  # one record every ~22 minutes for a month
    before = ledger.records_read
    totals = ledger.usage(0.0, float("inf"), limit=0)
    assert totals.requests == 2000
    assert ledger.records_read - before <= 2  # only records in the two partial minutes at the edges are read one by one
