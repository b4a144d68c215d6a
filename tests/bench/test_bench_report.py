"""The targets table's arithmetic and the frontier reading, on hand-made run metrics."""

from __future__ import annotations

import pytest

from bench.policy.frontier import throughput_at
from bench.policy.report import ceiling_note
from bench.policy.run_metrics import CostSplit, PhaseMetrics, RunMetrics
from bench.policy.scenario import Scenario
from bench.policy.suite import CONTROLLER, ORACLE, STATIC_KS, SuiteResult, static_name
from bench.policy.targets import T_K0, T_MIXED, T_ORACLE, T_SWITCHES, checks, mixed_ceiling

SCENARIO = Scenario.model_validate(
    {
        "name": "mix",
        "description": "two phases",
        "mixed": True,
        "phases": [
            {"name": "low", "duration_s": 10, "arrival": {"kind": "closed", "concurrency": 1}, "mix": [{}]},
            {"name": "high", "duration_s": 10, "arrival": {"kind": "closed", "concurrency": 9}, "mix": [{}]},
        ],
    }
)


def _metrics(policy: str, low: float, high: float, switches: float = 0.0) -> RunMetrics:
    nan = float("nan")
    phases = [PhaseMetrics(n, 10.0, g, g, nan, nan, 1.0) for n, g in (("low", low), ("high", high))]
    return RunMetrics(
        scenario="mix", policy=policy, window_s=20.0, throughput_tok_s=(low + high) / 2,
        goodput_tok_s=(low + high) / 2, sla_attainment={}, requests_finished=1, requests_unfinished=0,
        ttft_p50_s=nan, ttft_p99_s=nan, tpot_p50_s=nan, tpot_p99_s=nan, per_user_tok_s_p50=nan,
        accepted_length=1.0, mean_k=0.0, cost=CostSplit(1.0, 0.0, 0.0, 0.0), drafter_share=0.0,
        rejected_share=0.0, switches_per_worker_min=switches, step_k_changes_per_worker_min=0.0, phases=phases,
    )  # fmt: skip


def _result(controller: RunMetrics) -> SuiteResult:
    result = SuiteResult([SCENARIO])
    # k=0 is best in "high" (100 vs ≤ 90), k=8 in "low" (200).
    for k in STATIC_KS:
        low, high = (200.0, 50.0) if k == 8 else (100.0, 100.0 - k * 5)
        result.runs["mix", static_name(k)] = _metrics(static_name(k), low, high)
    result.runs["mix", ORACLE] = _metrics(ORACLE, 200.0, 100.0)
    result.runs["mix", CONTROLLER] = controller
    return result


def _by_target(result: SuiteResult) -> dict[str, list[bool]]:
    out: dict[str, list[bool]] = {}
    for c in checks(result):
        out.setdefault(c.target, []).append(c.met)
    return out


def test_a_controller_matching_the_oracle_meets_all_but_the_mixed_gain() -> None:
    got = _by_target(_result(_metrics(CONTROLLER, 200.0, 98.0, switches=1.0)))
    assert got[T_ORACLE] == [True]  # 149 / 150 ≥ 95 %
    assert got[T_MIXED] == [False]  # 149 vs the best static k=8 at 125: +19.2 % < 20 %
    assert got[T_K0] == [True]  # phase "high": 98 vs 100, −2 %
    assert got[T_SWITCHES] == [True]


def test_misses_are_reported() -> None:
    got = _by_target(_result(_metrics(CONTROLLER, 150.0, 90.0, switches=2.0)))
    assert got == {T_ORACLE: [False], T_MIXED: [False], T_K0: [False], T_SWITCHES: [False]}


def test_the_mixed_check_states_the_oracles_own_margin_over_the_best_static_k() -> None:
    result = _result(_metrics(CONTROLLER, 200.0, 98.0))
    # the oracle (150) over the best static k=8 (125): +20.0 %; the controller (149): +19.2 %
    [(scenario, margin)] = mixed_ceiling(result)
    assert scenario == "mix"
    assert margin == pytest.approx(0.2)
    mixed = next(c for c in checks(result) if c.target == T_MIXED)
    assert "+19.2% vs k=8" in mixed.value
    assert "oracle's own margin +20.0%" in mixed.value


def test_the_report_says_when_the_mixed_target_is_out_of_the_oracles_reach() -> None:
    result = _result(_metrics(CONTROLLER, 200.0, 98.0))
    result.runs["mix", ORACLE] = _metrics(ORACLE, 200.0, 60.0)  # 130: +4 % over k=8
    note = " ".join(ceiling_note(result))
    assert "mix +4.0%" in note
    assert "out of reach" in note


def test_throughput_at_matched_speed_interpolates_on_the_frontier() -> None:
    points = [(50.0, 1000.0), (100.0, 600.0), (200.0, 200.0)]
    assert throughput_at(points, 75.0) == pytest.approx(800.0)
    assert throughput_at(points, 200.0) == pytest.approx(200.0)
    assert throughput_at(points, 20.0) is None
    assert throughput_at(points, 250.0) is None
