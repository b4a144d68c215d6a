"""Metrics of one run, computed from the lab's per-request and per-step records.

Definitions (all over the measured window ``[warmup_s, duration_s)`` of the scenario clock):

- **throughput**: output tokens of the engine steps that ended in the window, per second (all workers);
- **goodput**: output tokens of requests that arrived in the window, finished (possibly during the drain)
  and met their tier's SLA (TTFT ≤ ``ttft_target_s`` and TPOT ≤ ``tpot_target_s`` where set), per second
  of window; a tier without targets counts every finished request;
- **TTFT / TPOT** quantiles over finished requests; **per-user speed** = 1 / TPOT (tokens/s of one stream);
- **accepted length**: output tokens per decoding request-step, over pure decode steps (no prefill) with k > 0;
- **cost**: every worker costs ``gpus × $/GPU-hour`` for the whole window, busy or idle. The split into the
  drafter, the verification of rejected drafts, and the rest uses the engine's own per-step times:
  drafter = Σ drafter seconds; rejected drafts = Σ over steps with k > 0 of (target time at k − target time
  at k = 0 for the same step shape, from ``fleet.perf.step_time``) × the rejected fraction of drafts measured
  on that worker at that k — the same rule as ``controller/cost.py``, with measured instead of windowed steps;
- **switches**: schedule changes per worker-minute (what an operator sees), and, separately, changes of the
  k actually used between consecutive steps of a worker (a batch-size table flickers here).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bench.policy.cost_meter import ModelCost
from bench.policy.lab import RawRun, TickSample
from bench.policy.scenario import Scenario
from fleet.perf import Profile, StepShape, load_profile, step_time
from fleet.stats import percentile
from workers.sim.records import RequestRecord, StepRecord


@dataclass(frozen=True, slots=True)
class PhaseMetrics:
    name: str
    duration_s: float
    throughput_tok_s: float
    goodput_tok_s: float
    per_user_tok_s_p50: float
    tpot_p50_s: float
    mean_decode_batch: float


@dataclass(frozen=True, slots=True)
class CostSplit:
    """USD per million output tokens, split into parts that add up to ``total``."""

    total: float
    drafter: float
    rejected_drafts: float
    idle: float

    @property
    def target(self) -> float:
        """The target model's useful work (verification of accepted tokens, prefill, overheads)."""
        return max(self.total - self.drafter - self.rejected_drafts - self.idle, 0.0)


@dataclass
class RunMetrics:
    scenario: str
    policy: str
    window_s: float
    throughput_tok_s: float
    goodput_tok_s: float
    sla_attainment: dict[str, float]
    """Tier → share of its finished requests that met the SLA."""
    requests_finished: int
    requests_unfinished: int
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    per_user_tok_s_p50: float
    accepted_length: float
    mean_k: float
    """Mean k per decoding request-step."""
    cost: CostSplit
    drafter_share: float
    rejected_share: float
    switches_per_worker_min: float
    step_k_changes_per_worker_min: float
    phases: list[PhaseMetrics] = field(default_factory=list)
    ticks: list[TickSample] = field(default_factory=list)
    model_cost: ModelCost | None = None
    """The same run priced by the controller's cost model (``bench.policy.cost_meter``)."""


def meets_sla(r: RequestRecord, scenario: Scenario) -> bool:
    tier = scenario.tiers.get(r.tag)
    if tier is None:
        return True
    if tier.ttft_target_s is not None and not r.ttft_s <= tier.ttft_target_s:
        return False
    return not (tier.tpot_target_s is not None and r.output_tokens >= 2 and not r.tpot_s <= tier.tpot_target_s)


def _window_requests(raw: RawRun, start: float, end: float) -> list[RequestRecord]:
    return [r for r in raw.records.requests if start <= r.arrival_s < end]


def _goodput_tokens(requests: Iterable[RequestRecord], scenario: Scenario) -> int:
    return sum(r.output_tokens for r in requests if r.finished and meets_sla(r, scenario))


def _step_tokens(steps: Iterable[StepRecord], start: float, end: float) -> int:
    return sum(s.tokens for s in steps if start < s.end_s <= end)


def _per_user(requests: Iterable[RequestRecord]) -> list[float]:
    return [1.0 / r.tpot_s for r in requests if r.finished and r.tpot_s > 0]


def phase_metrics(raw: RawRun) -> list[PhaseMetrics]:
    out = []
    sc = raw.scenario
    steps = raw.records.steps
    for phase, start, end in sc.phase_bounds():
        reqs = _window_requests(raw, start, end)
        tpots = [r.tpot_s for r in reqs if r.finished and not math.isnan(r.tpot_s)]
        in_phase = [s for s in steps if start < s.end_s <= end and s.decode_seqs > 0]
        batch = sum(s.decode_seqs for s in in_phase) / len(in_phase) if in_phase else 0.0
        out.append(
            PhaseMetrics(
                name=phase.name,
                duration_s=end - start,
                throughput_tok_s=_step_tokens(steps, start, end) / (end - start),
                goodput_tok_s=_goodput_tokens(reqs, sc) / (end - start),
                per_user_tok_s_p50=percentile(_per_user(reqs), 0.5),
                tpot_p50_s=percentile(tpots, 0.5),
                mean_decode_batch=batch,
            )
        )
    return out


def _extra_verify_s(profile: Profile, decode_seqs: int, k: int, prefill: int) -> float:
    """Target time a step spends because it verifies k drafts per sequence (context left out: equal both ways)."""
    with_k = step_time(profile, StepShape(decode_seqs, k, 0, prefill)).target_s
    without = step_time(profile, StepShape(decode_seqs, 0, 0, prefill)).target_s
    return max(with_k - without, 0.0)


def _rejected_fraction(steps: Sequence[StepRecord]) -> dict[tuple[int, int], float]:
    """(worker, k) → rejected fraction of draft tokens, from pure decode steps."""
    drafted: dict[tuple[int, int], int] = defaultdict(int)
    accepted: dict[tuple[int, int], int] = defaultdict(int)
    for s in steps:
        if s.k > 0 and s.prefill_tokens == 0 and s.decode_seqs > 0:
            drafted[s.worker, s.k] += s.decode_seqs * s.k
            accepted[s.worker, s.k] += max(s.tokens - s.decode_seqs, 0)
    return {key: 1.0 - min(accepted[key] / n, 1.0) for key, n in drafted.items() if n > 0}


def cost_split(raw: RawRun, profile: Profile, start: float, end: float) -> tuple[CostSplit, float, float]:
    """(USD/Mtok split, drafter share, rejected-draft share) over the window."""
    sc = raw.scenario
    steps = [s for s in raw.records.steps if start < s.end_s <= end]
    usd_per_s = sc.gpus_per_worker * sc.usd_per_gpu_hour / 3600.0
    worker_seconds = sc.workers * (end - start)
    busy = sum(s.duration_s for s in steps)
    drafter = sum(s.drafter_s for s in steps)
    rejected_frac = _rejected_fraction(steps)
    extra: dict[tuple[int, int, int], float] = {}
    rejected = 0.0
    for s in steps:
        if s.k > 0 and s.decode_seqs > 0:
            shape = (s.decode_seqs, s.k, s.prefill_tokens)
            if shape not in extra:
                extra[shape] = _extra_verify_s(profile, *shape)
            rejected += extra[shape] * rejected_frac.get((s.worker, s.k), 0.0)
    tokens = sum(s.tokens for s in steps)
    per_mtok = usd_per_s * 1e6 / tokens if tokens else math.nan
    split = CostSplit(
        total=worker_seconds * per_mtok,
        drafter=drafter * per_mtok,
        rejected_drafts=rejected * per_mtok,
        idle=max(worker_seconds - busy, 0.0) * per_mtok,
    )
    return split, drafter / worker_seconds, rejected / worker_seconds


def _tick_k_changes(ticks: Sequence[TickSample], start: float, end: float) -> int:
    last: dict[int, int] = {}
    changes = 0
    for t in ticks:
        if start <= t.t_s <= end:
            if t.worker in last and last[t.worker] != t.k:
                changes += 1
            last[t.worker] = t.k
    return changes


def _step_k_changes(steps: Sequence[StepRecord]) -> int:
    last: dict[int, int] = {}
    changes = 0
    for s in steps:
        if s.decode_seqs == 0:
            continue
        if s.worker in last and last[s.worker] != s.k:
            changes += 1
        last[s.worker] = s.k
    return changes


def summarise(raw: RawRun, profile: Profile | None = None) -> RunMetrics:
    """All metrics of one run."""
    sc = raw.scenario
    profile = profile or load_profile(sc.profile)
    start, end = sc.warmup_s, sc.duration_s
    window = end - start
    reqs = _window_requests(raw, start, end)
    finished = [r for r in reqs if r.finished]
    steps = raw.records.steps
    decode = [s for s in steps if start < s.end_s <= end and s.k > 0 and s.prefill_tokens == 0 and s.decode_seqs]
    decoding = [s for s in steps if start < s.end_s <= end and s.decode_seqs > 0]
    attainment: dict[str, float] = {}
    for tier in sorted({r.tag for r in finished}):
        mine = [r for r in finished if r.tag == tier]
        attainment[tier] = sum(meets_sla(r, sc) for r in mine) / len(mine)
    split, drafter_share, rejected_share = cost_split(raw, profile, start, end)
    worker_minutes = sc.workers * window / 60.0
    tpots = [r.tpot_s for r in finished if not math.isnan(r.tpot_s)]
    return RunMetrics(
        scenario=sc.name,
        policy=raw.policy,
        window_s=window,
        throughput_tok_s=_step_tokens(steps, start, end) / window,
        goodput_tok_s=_goodput_tokens(reqs, sc) / window,
        sla_attainment=attainment,
        requests_finished=len(finished),
        requests_unfinished=len(reqs) - len(finished),
        ttft_p50_s=percentile([r.ttft_s for r in finished], 0.5),
        ttft_p99_s=percentile([r.ttft_s for r in finished], 0.99),
        tpot_p50_s=percentile(tpots, 0.5),
        tpot_p99_s=percentile(tpots, 0.99),
        per_user_tok_s_p50=percentile(_per_user(finished), 0.5),
        accepted_length=sum(s.tokens for s in decode) / sum(s.decode_seqs for s in decode) if decode else 1.0,
        mean_k=sum(s.k * s.decode_seqs for s in decoding) / max(sum(s.decode_seqs for s in decoding), 1),
        cost=split,
        drafter_share=drafter_share,
        rejected_share=rejected_share,
        switches_per_worker_min=_tick_k_changes(raw.ticks, start, end) / worker_minutes,
        step_k_changes_per_worker_min=_step_k_changes([s for s in steps if start < s.end_s <= end]) / worker_minutes,
        phases=phase_metrics(raw),
        ticks=raw.ticks,
        model_cost=raw.model_cost,
    )
