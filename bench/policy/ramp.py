"""The controller's load-ramp comparison in virtual time: the same closed-loop trace (1 → 64 → 1 concurrent
streams by default) run with static k=0, static k=8 and the gearshift controller; per phase the k the
controller chose and each policy's throughput, overall throughput and mean/p99 TPOT.

``ramp_comparison`` is reusable (the bench calls it); ``gearshift controller ramp`` prints it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from bench.policy.controller_lab import LabTrace, lab_controller, run_lab
from controller.settings import ControllerSettings
from fleet.clock import ManualClock
from fleet.perf import Profile
from fleet.stats import percentile
from workers.sim.arrivals import Lengths, Phase, PhasedLoad, WorkloadMix
from workers.sim.records import RunRecords
from workers.sim.virtual import VirtualLab, make_worker

DEFAULT_LEVELS = (1, 2, 4, 8, 16, 32, 64, 32, 16, 8, 4, 2, 1)


@dataclass(frozen=True)
class PolicyResult:
    name: str
    records: RunRecords
    trace: LabTrace
    duration_s: float

    def throughput(self, start_s: float = 0.0, end_s: float | None = None) -> float:
        """Output tokens per second over ``(start_s, end_s]``."""
        return self.records.throughput(start_s, self.duration_s if end_s is None else end_s)

    def tpots(self) -> list[float]:
        return [r.tpot_s for r in self.records.finished() if not math.isnan(r.tpot_s)]

    def mean_tpot_s(self) -> float:
        values = self.tpots()
        return sum(values) / len(values) if values else math.nan

    def p99_tpot_s(self) -> float:
        return percentile(self.tpots(), 0.99)


@dataclass(frozen=True)
class RampReport:
    levels: tuple[int, ...]
    phase_s: float
    results: tuple[PolicyResult, ...]

    def controller_k(self, phase: int) -> list[int]:
        """The controller's applied k at each tick of ``phase``."""
        ctl = next(r for r in self.results if r.name == "controller")
        start, end = phase * self.phase_s, (phase + 1) * self.phase_s
        return [k for t, k in ctl.trace.k_of("w0") if start < t <= end]


def ramp_phases(levels: Sequence[int], phase_s: float, mix: WorkloadMix) -> list[Phase]:
    return [Phase(phase_s, mix, concurrency=c, name=f"{c} streams") for c in levels]


async def run_policy(
    profile: Profile,
    phases: Sequence[Phase],
    *,
    static_k: int | None,
    seed: int,
    tick_s: float,
    settings: ControllerSettings | None = None,
) -> PolicyResult:
    """One run of ``phases`` on one simulated worker: static ``static_k``, or the controller when None."""
    clock = ManualClock()
    start_k = static_k if static_k is not None else profile.drafter.k_max
    worker = make_worker(profile, "w0", clock, k=start_k, seed=seed)
    lab = VirtualLab([worker], PhasedLoad(phases), clock=clock, seed=seed + 1)
    controller = None
    if static_k is None:
        controller = lab_controller([worker], profile, clock, settings=settings or ControllerSettings(tick_s=tick_s))
    duration = sum(p.duration_s for p in phases)
    trace = await run_lab(lab, controller, until_s=duration, tick_s=tick_s)
    name = "controller" if static_k is None else f"static k={static_k}"
    return PolicyResult(name, lab.records, trace, duration)


async def ramp_comparison(
    profile: Profile,
    *,
    levels: Sequence[int] = DEFAULT_LEVELS,
    phase_s: float = 60.0,
    workload: str = "maths",
    prompt_tokens: int = 1000,
    output_tokens: int = 400,
    statics: Sequence[int] = (0, 8),
    seed: int = 1,
    tick_s: float = 2.0,
) -> RampReport:
    """Run the ramp with each static k and with the controller on the same seeded trace."""
    mix = WorkloadMix.single(workload, Lengths(prompt_tokens, 0.3), Lengths(output_tokens, 0.3))
    phases = ramp_phases(levels, phase_s, mix)
    results = [await run_policy(profile, phases, static_k=k, seed=seed, tick_s=tick_s) for k in statics]
    results.append(await run_policy(profile, phases, static_k=None, seed=seed, tick_s=tick_s))
    return RampReport(tuple(levels), phase_s, tuple(results))


def _k_summary(ks: Sequence[int]) -> str:
    """Distinct k values in order of first appearance, with the most common one marked."""
    if not ks:
        return "—"
    order: list[int] = []
    for k in ks:
        if not order or order[-1] != k:
            order.append(k)
    common = Counter(ks).most_common(1)[0][0]
    path = "→".join(str(k) for k in order[:6]) + ("→…" if len(order) > 6 else "")
    return f"{path} (mostly {common})"


def markdown(report: RampReport) -> str:
    """The report as Markdown tables: per phase, then overall."""
    names = [r.name for r in report.results]
    lines = ["| phase | streams | controller k | " + " | ".join(f"{n} tok/s" for n in names) + " |"]
    lines.append("|" + "---|" * (3 + len(names)))
    for i, level in enumerate(report.levels):
        start, end = i * report.phase_s, (i + 1) * report.phase_s
        tps = " | ".join(f"{r.throughput(start, end):.0f}" for r in report.results)
        lines.append(f"| {i + 1} | {level} | {_k_summary(report.controller_k(i))} | {tps} |")
    lines += [
        "",
        "| policy | throughput tok/s | mean TPOT ms | p99 TPOT ms | requests | k switches |",
        "|---|---|---|---|---|---|",
    ]
    for r in report.results:
        switches = len(r.trace.switches("w0"))
        lines.append(
            f"| {r.name} | {r.throughput():.0f} | {r.mean_tpot_s() * 1e3:.1f} | {r.p99_tpot_s() * 1e3:.1f} | "
            f"{len(r.records.finished())} | {switches} |"
        )
    return "\n".join(lines)
