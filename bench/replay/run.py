"""Replay one trace under every policy: static k ∈ {0, 1, 2, 4, k_max} (k_max is the recipe default), every lab
policy (``bench.policy.policies.LAB_POLICIES``: the controller, adaptive verification, both, and any policy added
there), then the per-phase oracle (per window, the static k with the highest goodput in it). The same trace and
seed for all.

``--workers auto`` (``smallest_fleet``): per policy, the smallest worker count whose run meets every tier's SLA,
found by doubling then bisection over whole runs (SLA met: every tier's attainment ≥ ``SLA_TARGET`` and no
growing backlog).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from bench.executor import Executor, LocalPool
from bench.policy.lab import RawRun, run_policy
from bench.policy.policies import LAB_POLICIES, LabPolicy, PhaseOracle, StaticSchedule
from bench.policy.run_metrics import RunMetrics, delivered_tokens, summarise, verdicts
from bench.policy.suite import ORACLE, oracle_ks, static_ks, static_name
from bench.replay.scenario import ReplayPlan
from bench.replay.stream_metrics import StreamedRun
from fleet.perf import Profile, load_profile
from fleet.stats import percentile

SLA_TARGET = 0.99
"""Share of a tier's requests that must meet its SLA for ``--workers auto``."""
MAX_WORKERS = 256


@dataclass(frozen=True, slots=True)
class TierLatency:
    """One tier's figures in one run: goodput within its SLA (tok/s over the window) and latency quantiles (s)."""

    goodput_tok_s: float
    finished_tok_s: float
    """Output tokens of the tier's requests that finished inside the window, per second of the window."""
    requests: int
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float


@dataclass
class PolicyRun:
    policy: str
    metrics: RunMetrics
    tiers: dict[str, TierLatency]
    wall_s: float
    k_over_time: list[tuple[float, float]] = field(default_factory=list)
    """(virtual s, mean k over the workers) per tick."""

    @property
    def usd_per_mtok(self) -> float:
        return self.metrics.cost.total

    def meets_sla(self) -> bool:
        m = self.metrics
        attained = all(not math.isnan(a) and a >= SLA_TARGET for a in m.sla_attainment.values())
        return attained and not m.backlog.growing


def _tier_figures(raw_run: RawRun) -> dict[str, TierLatency]:
    sc = raw_run.scenario
    start, end = sc.warmup_s, sc.duration_s
    good = verdicts(raw_run)
    out: dict[str, TierLatency] = {}
    requests = raw_run.records.requests
    for tier in sorted({r.tag for r in requests}):
        mine_good = [g if r.tag == tier else None for r, g in zip(requests, good, strict=True)]
        done = [r for r in requests if r.tag == tier and start <= r.arrival_s < end and r.finished]
        tpots = [r.tpot_s for r in done if not math.isnan(r.tpot_s)]
        out[tier] = TierLatency(
            goodput_tok_s=delivered_tokens(raw_run, start, end, mine_good) / (end - start),
            finished_tok_s=sum(r.output_tokens for r in done if r.finish_s <= end) / (end - start),
            requests=sum(1 for r in requests if r.tag == tier and start <= r.arrival_s < end),
            ttft_p50_s=percentile([r.ttft_s for r in done], 0.5),
            ttft_p99_s=percentile([r.ttft_s for r in done], 0.99),
            tpot_p50_s=percentile(tpots, 0.5),
            tpot_p99_s=percentile(tpots, 0.99),
        )
    return out


def _streamed_tier_figures(sink: StreamedRun) -> dict[str, TierLatency]:
    window = sink.end - sink.start
    return {
        tier: TierLatency(
            goodput_tok_s=f.delivered_good_tokens / window,
            finished_tok_s=f.finished_tokens / window,
            requests=f.requests,
            ttft_p50_s=percentile(f.ttft_s, 0.5),
            ttft_p99_s=percentile(f.ttft_s, 0.99),
            tpot_p50_s=percentile(f.tpot_s, 0.5),
            tpot_p99_s=percentile(f.tpot_s, 0.99),
        )
        for tier, f in sink.tiers().items()
    }


def _k_over_time(metrics: RunMetrics) -> list[tuple[float, float]]:
    by_t: dict[float, list[int]] = {}
    for s in metrics.ticks:
        by_t.setdefault(s.t_s, []).append(s.k)
    return [(t, sum(ks) / len(ks)) for t, ks in sorted(by_t.items())]


def run_one(plan: ReplayPlan, policy: LabPolicy, profile: Profile | None = None, *, streamed: bool = True) -> PolicyRun:
    """One policy over the whole trace. ``streamed`` (the default) folds the metrics as the run goes
    (``bench.replay.stream_metrics``: memory bounded by the requests in flight); False keeps every record and
    computes the same figures from them (``bench.policy.run_metrics``, the definitions)."""
    started = time.perf_counter()
    profile = profile or load_profile(plan.profile_path)
    if streamed:
        sink = StreamedRun(plan.scenario, profile)
        raw = run_policy(plan.scenario, policy, profile=profile, load=plan.load(), priced=False, sink=sink)
        metrics = sink.metrics(raw)
        return PolicyRun(
            policy.name, metrics, _streamed_tier_figures(sink), time.perf_counter() - started, sink.k_over_time
        )
    raw = run_policy(plan.scenario, policy, profile=profile, load=plan.load(), priced=False)
    metrics = summarise(raw, profile)
    tiers = _tier_figures(raw)
    series = _k_over_time(metrics)
    metrics = replace(metrics, ticks=[])  # the series keeps what the report plots; drop the bulk
    return PolicyRun(policy.name, metrics, tiers, time.perf_counter() - started, series)


def replay_policies(profile: Profile) -> list[LabPolicy]:
    """Static k (``bench.policy.suite.static_ks``) and every lab policy; the oracle runs after them."""
    return [StaticSchedule.plain(k) for k in static_ks(profile)] + [make() for make in LAB_POLICIES.values()]


def _run_shared(plan: ReplayPlan, policy: LabPolicy, streamed: bool) -> PolicyRun:
    return run_one(plan, policy, streamed=streamed)


Progress = Callable[[str], None]


def _run_all(
    plan: ReplayPlan, policies: Sequence[LabPolicy], pool: Executor, progress: Progress, streamed: bool
) -> list[PolicyRun]:
    """Every policy on ``plan``, on ``pool`` (the plan goes to each worker once: a trace is too big to send per
    job)."""
    out = []
    for run in pool.map(_run_shared, [(p, streamed) for p in policies], shared=plan):
        out.append(run)
        progress(f"{run.policy}: {run.wall_s:.1f} s")
    return out


@dataclass
class ReplayResult:
    plan: ReplayPlan
    runs: dict[str, PolicyRun]
    oracle_choice: dict[str, int]
    recipe: str
    wall_s: float
    fleets: dict[str, int | None] = field(default_factory=dict)
    """``--workers auto``: policy → the smallest worker count meeting every tier's SLA (None: not within
    ``MAX_WORKERS``)."""


def replay(
    plan: ReplayPlan,
    *,
    processes: int | None = None,
    progress: Progress = lambda _: None,
    streamed: bool = True,
    executor: Executor | None = None,
) -> ReplayResult:
    """Every policy, then the oracle, on ``plan`` (``streamed``: as ``run_one``), on ``executor`` (by default
    ``processes`` worker processes)."""
    started = time.perf_counter()
    pool = executor or LocalPool(processes)
    profile = load_profile(plan.profile_path)
    ks = static_ks(profile)
    runs = {r.policy: r for r in _run_all(plan, replay_policies(profile), pool, progress, streamed)}
    choice = oracle_ks(plan.scenario, [runs[static_name(k)].metrics for k in ks])
    oracle = run_one(plan, PhaseOracle(ORACLE, choice), profile, streamed=streamed)
    progress(f"{ORACLE}: {oracle.wall_s:.1f} s")
    runs[ORACLE] = oracle
    return ReplayResult(plan, runs, choice, static_name(ks[-1]), time.perf_counter() - started)


def smallest_fleet(
    make_plan: Callable[[int], ReplayPlan],
    make_policy: Callable[[], LabPolicy],
    *,
    start: int = 1,
    progress: Progress = lambda _: None,
) -> int | None:
    """The smallest worker count at which ``make_policy()``'s run of ``make_plan(workers)`` meets every tier's
    SLA: doubling from ``start`` until one does, then bisection (None: none up to ``MAX_WORKERS``)."""

    def ok(n: int) -> bool:
        run = run_one(make_plan(n), make_policy())
        progress(f"{run.policy} on {n} workers: {'meets' if run.meets_sla() else 'misses'} the SLA")
        return run.meets_sla()

    lo, hi = 0, max(start, 1)
    while not ok(hi):
        lo, hi = hi, hi * 2
        if hi > MAX_WORKERS:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi
