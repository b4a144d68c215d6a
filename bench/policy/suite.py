"""The policy comparison: every policy on every scenario, the same seeded trace for all, then the oracle.

Baselines tuned offline from the shared performance model for each scenario's traffic mix:

- ``vllm-table``: vLLM's ``num_speculative_tokens_per_batch_size`` table with the best static k for each
  batch-size band (1, 2–3, 4–7, … , 128–max), applied by the engine per step on the instantaneous batch;
- ``gate``: k = the best k at batch 1 up to a threshold batch, 0 above it; the threshold is the smallest batch at
  which the best k > 0 gains less than ``GATE_MIN_GAIN`` over k = 0 on the profile.

The oracle runs after the static runs: for each phase, the static k with the highest goodput in that phase.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field

from bench.policy.capacity import MixPoint, best_k, max_batch, throughput
from bench.policy.lab import mix_point, run_policy
from bench.policy.policies import ControllerPolicy, LabPolicy, PhaseOracle, StaticSchedule
from bench.policy.run_metrics import RunMetrics, summarise
from bench.policy.scenario import Scenario
from fleet.perf import Profile, load_profile

STATIC_KS: tuple[int, ...] = (0, 1, 2, 4, 8)
TABLE_BANDS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
GATE_MIN_GAIN = 0.10
CONTROLLER = "gearshift"
ORACLE = "oracle"


def static_name(k: int) -> str:
    return f"k={k}"


def scenario_mix(scenario: Scenario) -> MixPoint:
    """The duration-weighted mean request shape over all phases."""
    points = [(mix_point(p), p.duration_s) for p in scenario.phases]
    total = sum(d for _, d in points)
    workloads: dict[str, float] = {}
    for point, d in points:
        weight_sum = sum(w for _, w in point.workloads)
        for name, w in point.workloads:
            workloads[name] = workloads.get(name, 0.0) + w / weight_sum * d / total
    return MixPoint(
        workloads=tuple(workloads.items()),
        prompt_tokens=sum(p.prompt_tokens * d for p, d in points) / total,
        output_tokens=sum(p.output_tokens * d for p, d in points) / total,
    )


def vllm_table(profile: Profile, scenario: Scenario) -> StaticSchedule:
    """The best static k per batch-size band, adjacent equal bands merged (vLLM's table format)."""
    mix = scenario_mix(scenario)
    top = scenario.max_num_seqs
    rows: list[list[int]] = []
    bands = [b for b in TABLE_BANDS if b <= top]
    for i, lo in enumerate(bands):
        hi = bands[i + 1] - 1 if i + 1 < len(bands) else top
        probe = max(lo, min(hi, round((lo * hi) ** 0.5), max_batch(profile, mix, top)))
        k = best_k(profile, mix, probe)
        if rows and rows[-1][2] == k:
            rows[-1][1] = hi
        else:
            rows.append([lo, hi, k])
    return StaticSchedule("vllm-table", tuple((a, b, k) for a, b, k in rows))


def threshold_gate(profile: Profile, scenario: Scenario) -> StaticSchedule:
    """k_on below the threshold batch, 0 from it on."""
    mix = scenario_mix(scenario)
    top = scenario.max_num_seqs
    k_on = best_k(profile, mix, 1)
    threshold = top + 1
    for batch in range(1, max_batch(profile, mix, top) + 1):
        gain = throughput(profile, mix, batch, best_k(profile, mix, batch))[0] / throughput(profile, mix, batch, 0)[0]
        if gain < 1.0 + GATE_MIN_GAIN:
            threshold = batch
            break
    if threshold > top:
        return StaticSchedule("gate", ((1, top, k_on),))
    if threshold == 1:
        return StaticSchedule("gate", ((1, top, 0),))
    return StaticSchedule("gate", ((1, threshold - 1, k_on), (threshold, top, 0)))


def baseline_policies(profile: Profile, scenario: Scenario) -> list[LabPolicy]:
    out: list[LabPolicy] = [StaticSchedule.plain(k) for k in STATIC_KS]
    out += [vllm_table(profile, scenario), threshold_gate(profile, scenario), ControllerPolicy(name=CONTROLLER)]
    return out


def oracle_ks(scenario: Scenario, statics: Sequence[RunMetrics]) -> dict[str, int]:
    """Per phase, the static k whose run had the highest goodput in that phase (ties: the smaller k)."""
    out: dict[str, int] = {}
    for phase in scenario.phases:
        best = max(
            statics,
            key=lambda m: (next(p.goodput_tok_s for p in m.phases if p.name == phase.name), -int(m.policy[2:])),
        )
        out[phase.name] = int(best.policy[2:])
    return out


def _run_one(scenario: Scenario, policy: LabPolicy) -> RunMetrics:
    profile = load_profile(scenario.profile)
    return summarise(run_policy(scenario, policy, profile=profile), profile)


@dataclass
class SuiteResult:
    scenarios: list[Scenario]
    runs: dict[tuple[str, str], RunMetrics] = field(default_factory=dict)
    """(scenario, policy) → metrics."""
    oracle_choice: dict[str, dict[str, int]] = field(default_factory=dict)
    baselines: dict[str, dict[str, str]] = field(default_factory=dict)
    """scenario → policy name → its table, for the report."""

    def policies(self) -> list[str]:
        seen: list[str] = []
        for _, p in self.runs:
            if p not in seen:
                seen.append(p)
        order = [static_name(k) for k in STATIC_KS] + ["vllm-table", "gate", CONTROLLER, ORACLE]
        return sorted(seen, key=lambda p: order.index(p) if p in order else len(order))


Progress = Callable[[str], None]


def run_suite(
    scenarios: Sequence[Scenario], *, processes: int | None = None, progress: Progress = lambda _: None
) -> SuiteResult:
    """Run every policy on every scenario (``processes`` worker processes; 1 runs in this process)."""
    processes = processes or min(2, os.cpu_count() or 1)
    result = SuiteResult(list(scenarios))
    first: list[tuple[Scenario, LabPolicy]] = []
    for sc in scenarios:
        profile = load_profile(sc.profile)
        policies = baseline_policies(profile, sc)
        result.baselines[sc.name] = {
            p.name: str([list(r) for r in p.rows]) for p in policies if isinstance(p, StaticSchedule)
        }
        first += [(sc, p) for p in policies]
    _execute(first, result, processes, progress)
    second: list[tuple[Scenario, LabPolicy]] = []
    for sc in scenarios:
        statics = [result.runs[sc.name, static_name(k)] for k in STATIC_KS]
        choice = oracle_ks(sc, statics)
        result.oracle_choice[sc.name] = choice
        second.append((sc, PhaseOracle(ORACLE, choice)))
    _execute(second, result, processes, progress)
    return result


def _execute(jobs: list[tuple[Scenario, LabPolicy]], result: SuiteResult, processes: int, progress: Progress) -> None:
    if processes <= 1:
        for sc, policy in jobs:
            result.runs[sc.name, policy.name] = _run_one(sc, policy)
            progress(f"{sc.name} · {policy.name}")
        return
    with ProcessPoolExecutor(max_workers=processes) as pool:
        futures: list[tuple[Scenario, LabPolicy, Future[RunMetrics]]] = [
            (sc, policy, pool.submit(_run_one, sc, policy)) for sc, policy in jobs
        ]
        for sc, policy, fut in futures:
            result.runs[sc.name, policy.name] = fut.result()
            progress(f"{sc.name} · {policy.name}")
