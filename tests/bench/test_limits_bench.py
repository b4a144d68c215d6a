"""``bench.limits``'s arithmetic: the in-progress count from ledger intervals and what counts as a met target
(the benchmark itself runs real processes: ``gearshift bench limits``)."""

from __future__ import annotations

from bench.limits import LimitResult, LimitsBenchConfig, max_overlap, max_spend_within
from fleet.store.protocol import UsageRecord


def test_overlap_counts_intervals_open_at_one_instant_and_a_handover_as_one() -> None:
    assert max_overlap([]) == 0
    assert max_overlap([(0.0, 2.0), (1.0, 3.0), (1.5, 1.6)]) == 3
    assert max_overlap([(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)]) == 1  # one ends as the next is admitted


def test_rpm_is_met_within_one_percent_and_the_others_within_their_bound() -> None:
    assert LimitResult("redis", "rpm", 300, 303, 0.0).met
    assert not LimitResult("redis", "rpm", 300, 304, 0.0).met
    assert not LimitResult("redis", "rpm", 300, 296, 0.0).met
    assert LimitResult("redis", "concurrency", 8, 8, 0.0).met
    assert not LimitResult("redis", "concurrency", 8, 9, 0.0).met
    assert LimitResult("redis", "budget", 0.05, 0.06, 0.02).met
    assert not LimitResult("redis", "budget", 0.05, 0.08, 0.02).met


def test_a_leased_limit_is_met_within_its_stated_lease_bound() -> None:
    config = LimitsBenchConfig()
    bound = config.lease_bound("leased", 1000)
    assert bound == config.lease_max_outstanding * config.lease_fraction * 1000
    assert config.lease_bound("exact", 1000) == 0.0
    assert LimitResult("redis", "rpm", 1000, 1000 + 10 + bound, bound, experiment="leased").met
    assert not LimitResult("redis", "rpm", 1000, 1000 + 10 + bound + 1, bound, experiment="leased").met
    assert not LimitResult("redis", "rpm", 1000, 1000 - 10 - bound - 1, bound, experiment="leased").met


def test_the_most_spent_within_a_span_slides_over_the_records() -> None:
    def rec(at: float, usd: float) -> UsageRecord:
        return UsageRecord(request_id=f"r{at}", tenant="t", model="m", worker_id=None, prompt_tokens=0,
                           completion_tokens=0, cost_usd=usd, status="ok", at=at)  # fmt: skip

    records = [rec(0.0, 1.0), rec(1.0, 2.0), rec(2.5, 4.0), rec(10.0, 0.5)]
    assert max_spend_within(records, 2.0) == 6.0  # 1.0 and 2.5
    assert max_spend_within(records, 100.0) == 7.5
    assert max_spend_within([], 2.0) == 0.0
