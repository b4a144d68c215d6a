"""The hindsight references of issue 25 (``bench.policy.references``) on hand-made run metrics: the plan per
phase, the restart charged at a change of drafter mode, and the figures the issue-25/24 targets read."""

from __future__ import annotations

import pytest

from bench.policy.references import best_plan
from bench.policy.run_metrics import CostSplit, PhaseMetrics, RunMetrics

PHASE_S = 100.0


def _metrics(policy: str, *goodput: float) -> RunMetrics:
    nan = float("nan")
    phases = [PhaseMetrics(f"p{i}", PHASE_S, g, g, nan, nan, 1.0) for i, g in enumerate(goodput)]
    mean = sum(goodput) / len(goodput)
    return RunMetrics(
        scenario="s", policy=policy, window_s=PHASE_S * len(goodput), throughput_tok_s=mean, goodput_tok_s=mean,
        sla_attainment={}, requests_finished=1, requests_unfinished=0, ttft_p50_s=nan, ttft_p99_s=nan,
        tpot_p50_s=nan, tpot_p99_s=nan, per_user_tok_s_p50=nan, accepted_length=1.0, mean_k=0.0,
        cost=CostSplit(1.0, 0.0, 0.0, 0.0), drafter_share=0.0, rejected_share=0.0, switches_per_worker_min=0.0,
        step_k_changes_per_worker_min=0.0, phases=phases,
    )  # fmt: skip


def test_one_configuration_is_credited_its_own_run() -> None:
    run = _metrics("k=2", 100.0, 300.0)
    ref = best_plan("oracle", [run], restart_s=50.0)
    assert ref.goodput_tok_s == pytest.approx(run.goodput_tok_s)
    assert ref.restart_tokens == 0


def test_a_k_switch_is_free_and_the_best_of_each_phase_is_taken() -> None:
    ref = best_plan("oracle", [_metrics("k=4", 200.0, 100.0), _metrics("k=0", 100.0, 150.0)], restart_s=1e6)
    assert ref.choice == (("p0", "k=4"), ("p1", "k=0"))
    assert ref.goodput_tok_s == pytest.approx(175.0)


def test_a_switch_to_no_drafter_pays_the_restart_at_the_destination_phase_rate() -> None:
    runs = [_metrics("k=4", 200.0, 100.0), _metrics("no-drafter", 100.0, 160.0)]
    ref = best_plan("oracle", runs, restart_s=25.0)
    # k=4 then no-drafter: 200·100 + 160·(100 − 25) = 32 000 tokens over 200 s; staying on k=4: 30 000
    assert ref.choice == (("p0", "k=4"), ("p1", "no-drafter"))
    assert ref.restart_tokens == pytest.approx(4000.0)
    assert ref.goodput_tok_s == pytest.approx(160.0)
    assert ref.phase_goodput["p1"] == pytest.approx(120.0)


def test_a_restart_longer_than_its_gain_is_not_taken() -> None:
    runs = [_metrics("k=4", 200.0, 100.0), _metrics("no-drafter", 100.0, 160.0)]
    ref = best_plan("oracle", runs, restart_s=50.0)  # 160 · 50 = 8 000 lost > 6 000 gained
    assert ref.choice == (("p0", "k=4"), ("p1", "k=4"))
    assert ref.goodput_tok_s == pytest.approx(150.0)


def test_starting_drafter_free_costs_nothing_and_coming_back_does() -> None:
    runs = [_metrics("k=4", 100.0, 300.0), _metrics("no-drafter", 200.0, 100.0)]
    ref = best_plan("oracle", runs, restart_s=10.0)
    # no-drafter first (free), then k=4 paying 300 · 10: 20 000 + 27 000 = 47 000; k=4 throughout: 40 000
    assert ref.choice == (("p0", "no-drafter"), ("p1", "k=4"))
    assert ref.goodput_tok_s == pytest.approx(235.0)
