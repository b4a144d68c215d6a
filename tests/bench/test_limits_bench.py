"""``bench.limits``'s arithmetic: the in-progress count from ledger intervals and what counts as a met target
(the benchmark itself runs real processes: ``gearshift bench limits``)."""

from __future__ import annotations

from bench.limits import LimitResult, max_overlap


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
