"""Metrics of one run, computed from the lab's per-request and per-step records.

Definitions (all over the measured window ``[warmup_s, duration_s)`` of the scenario clock):

- **throughput**: output tokens of the engine steps that ended in the window, per second (all workers);
- **goodput** (DESIGN §8, honest): output tokens *delivered inside the window* (a request's tokens at the
  window's end less its tokens at its start, from the run's boundary marks) by requests whose verdict is
  *met*, per second of window. Tokens delivered after the window's end (in the drain) never count. The
  verdict is taken once, at the window's end: a request finished by then met its SLA if TTFT ≤
  ``ttft_target_s`` and TPOT ≤ ``tpot_target_s`` (where set); a request still unfinished then is judged *so
  far*: TTFT ≤ target (a request still without its first token misses once it has waited longer than the
  target), and its TPOT so far, (window end − first token) / (tokens so far − 1), ≤ target. So an unfinished
  request that is on its SLA keeps its in-window tokens; one that is not counts zero. A tier without targets
  counts every request. A request the gateway would have refused (503: its speculation mode, ``off``, left no
  worker, ``bench.policy.routing``) is a miss. A phase's goodput uses the phase's bounds and the same verdict;
- **backlog**: requests arrived and unfinished at a time; per phase and per run, at the start and the end,
  and *growing* when the end exceeds the start by more than ``BACKLOG_SLACK`` (a share of the requests that
  arrived in between, at least ``BACKLOG_MIN``): a policy whose backlog grows has not served its load;
- **SLA attainment** per tier: share of the requests that arrived in the window whose verdict is met, over
  those with a verdict (a request still waiting for its first token within its TTFT target has none yet);
- **TTFT / TPOT** quantiles over requests that arrived in the window and finished, the drain included (a drain
  runs for latency figures, never for credit); **per-user speed** = 1 / TPOT (tokens/s of one stream);
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

import bisect
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bench.policy.cost_meter import ModelCost
from bench.policy.lab import RawRun, TickSample
from bench.policy.scenario import Scenario
from fleet.config import TierConfig
from fleet.perf import Profile, StepShape, load_profile, step_time
from fleet.stats import percentile
from workers.sim.records import RequestRecord, StepRecord

BACKLOG_SLACK = 0.10
"""A backlog grows when it rises by more than this share of the requests that arrived meanwhile …"""
BACKLOG_MIN = 4
"""… and by more than this many requests."""


@dataclass(frozen=True, slots=True)
class Backlog:
    """Requests arrived and unfinished at the start and the end of a span, and what arrived in between."""

    start: int
    end: int
    arrived: int

    @property
    def growing(self) -> bool:
        return self.end - self.start > max(BACKLOG_MIN, BACKLOG_SLACK * self.arrived)


@dataclass(frozen=True, slots=True)
class PhaseMetrics:
    name: str
    duration_s: float
    throughput_tok_s: float
    goodput_tok_s: float
    per_user_tok_s_p50: float
    tpot_p50_s: float
    mean_decode_batch: float
    backlog: Backlog = Backlog(0, 0, 0)


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
    """Tier → share of its requests (arrived in the window, with a verdict) that met the SLA."""
    requests_finished: int
    """Requests that arrived in the window and finished by its end."""
    requests_unfinished: int
    """Requests that arrived in the window and were still unfinished at its end."""
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
    backlog: Backlog = Backlog(0, 0, 0)
    """Over the whole window."""


def meets_sla(r: RequestRecord, tier: TierConfig | None) -> bool:
    """The SLA verdict of a finished request under its tier (None: no targets)."""
    if tier is None:
        return True
    if tier.ttft_target_s is not None and not r.ttft_s <= tier.ttft_target_s:
        return False
    return not (tier.tpot_target_s is not None and r.output_tokens >= 2 and not r.tpot_s <= tier.tpot_target_s)


def verdict_at(r: RequestRecord, tokens: int, t_s: float, tier: TierConfig | None) -> bool | None:
    """Whether ``r`` is on its SLA at ``t_s`` when it had delivered ``tokens`` by then: the final verdict if it
    finished by ``t_s``, else the verdict so far; None while it waits for its first token within its TTFT
    target (nothing to judge yet)."""
    if r.finished and r.finish_s <= t_s:
        return meets_sla(r, tier)
    if tier is None:
        return True
    started = r.first_token_s <= t_s
    waited = (r.first_token_s if started else t_s) - r.arrival_s
    if tier.ttft_target_s is not None and not waited <= tier.ttft_target_s:
        return False
    if not started:
        return None if tier.ttft_target_s is not None else True
    if tier.tpot_target_s is not None and tokens >= 2:
        return (t_s - r.first_token_s) / (tokens - 1) <= tier.tpot_target_s
    return True


def _tokens_at(raw: RawRun, t_s: float) -> list[int]:
    if t_s not in raw.marks:
        raise ValueError(f"no token marks at {t_s} s; marks at {sorted(raw.marks)}")
    return raw.marks[t_s]


def refused_indices(raw: RawRun) -> frozenset[int]:
    """Indices in ``raw.records.requests`` of the requests the gateway would have refused (``RawRun.refused``)."""
    reqs = raw.records.requests
    out = set()
    for i, worker_id, tier in raw.refused:
        if i >= len(reqs) or (reqs[i].worker_id, reqs[i].tag) != (worker_id, tier):
            raise ValueError(f"refused request {i} ({worker_id}, {tier}) is not the lab's request {i}")
        out.add(i)
    return frozenset(out)


def verdicts(raw: RawRun) -> list[bool | None]:
    """Every request's SLA verdict at the window's end (index-aligned with ``raw.records.requests``)."""
    sc = raw.scenario
    end = sc.duration_s
    at_end = _tokens_at(raw, end)
    refused = refused_indices(raw)
    out: list[bool | None] = []
    for i, r in enumerate(raw.records.requests):
        if r.arrival_s >= end:
            out.append(None)
            continue
        if i in refused:
            out.append(False)  # the gateway answered 503: the routing found no worker its speculation mode allows
            continue
        out.append(verdict_at(r, at_end[i] if i < len(at_end) else 0, end, sc.tiers.get(r.tag)))
    return out


def delivered_tokens(raw: RawRun, start: float, end: float, good: Sequence[bool | None]) -> int:
    """Output tokens delivered in ``[start, end)`` by requests whose verdict is met."""
    a, b = _tokens_at(raw, start), _tokens_at(raw, end)
    return sum(n - (a[i] if i < len(a) else 0) for i, n in enumerate(b) if good[i] is True)


def backlog(raw: RawRun, start: float, end: float) -> Backlog:
    """Requests arrived and unfinished at ``start`` and at ``end``, and the arrivals in ``[start, end)``."""
    reqs = raw.records.requests

    def open_at(t: float) -> int:
        return sum(1 for r in reqs if r.arrival_s < t and not (r.finished and r.finish_s <= t))

    return Backlog(open_at(start), open_at(end), sum(1 for r in reqs if start <= r.arrival_s < end))


def _step_tokens(steps: Iterable[StepRecord], start: float, end: float) -> int:
    return sum(s.tokens for s in steps if start < s.end_s <= end)


def _per_user(requests: Iterable[RequestRecord]) -> list[float]:
    return [1.0 / r.tpot_s for r in requests if r.finished and r.tpot_s > 0]


def _good_tokens(raw: RawRun, t_s: float, good: Sequence[bool | None]) -> int:
    """Output tokens delivered by ``t_s`` by requests whose verdict is met (``delivered_tokens`` is its rise)."""
    return sum(n for n, g in zip(_tokens_at(raw, t_s), good, strict=False) if g is True)


def _open_at(requests: Sequence[RequestRecord], times: Sequence[float]) -> list[int]:
    """``backlog``'s open count (arrived before t, not finished by t) at every t of the ascending ``times``, in one
    pass: a request is open at the times from its arrival's (exclusive) to its finish's (inclusive)."""
    rises = [0] * (len(times) + 1)
    for r in requests:
        first = bisect.bisect_right(times, r.arrival_s)
        past = bisect.bisect_left(times, r.finish_s) if r.finished else len(times)
        if first < past:
            rises[first] += 1
            rises[past] -= 1
    return list(itertools.accumulate(rises[:-1]))


def phase_metrics(raw: RawRun, good: Sequence[bool | None] | None = None) -> list[PhaseMetrics]:
    """Every phase's metrics, in one pass over the requests and one over the steps (a phase's requests are those
    arrived in ``[start, end)``, its steps those ended in ``(start, end]``; the phases tile the run)."""
    sc = raw.scenario
    good = good if good is not None else verdicts(raw)
    bounds = list(sc.phase_bounds())
    starts = [start for _, start, _ in bounds]
    ends = [end for _, _, end in bounds]
    reqs: list[list[RequestRecord]] = [[] for _ in bounds]
    for r in raw.records.requests:
        j = bisect.bisect_right(starts, r.arrival_s) - 1
        if j >= 0 and r.arrival_s < ends[j]:
            reqs[j].append(r)
    steps: list[list[StepRecord]] = [[] for _ in bounds]
    for s in raw.records.steps:
        j = bisect.bisect_left(ends, s.end_s)
        if j < len(bounds) and starts[j] < s.end_s:
            steps[j].append(s)
    times = sorted({*starts, *ends})
    opened = dict(zip(times, _open_at(raw.records.requests, times), strict=True))
    tokens = {t: _good_tokens(raw, t, good) for t in times}
    out = []
    for (phase, start, end), mine, ran in zip(bounds, reqs, steps, strict=True):
        tpots = [r.tpot_s for r in mine if r.finished and not math.isnan(r.tpot_s)]
        decoding = [s for s in ran if s.decode_seqs > 0]
        batch = sum(s.decode_seqs for s in decoding) / len(decoding) if decoding else 0.0
        out.append(
            PhaseMetrics(
                name=phase.name,
                duration_s=end - start,
                throughput_tok_s=sum(s.tokens for s in ran) / (end - start),
                goodput_tok_s=(tokens[end] - tokens[start]) / (end - start),
                per_user_tok_s_p50=percentile(_per_user(mine), 0.5),
                tpot_p50_s=percentile(tpots, 0.5),
                mean_decode_batch=batch,
                backlog=Backlog(opened[start], opened[end], len(mine)),
            )
        )
    return out


def extra_verify_s(profile: Profile, decode_seqs: int, k: int, prefill: int) -> float:
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
    return rejected_fractions(drafted, accepted)


def rejected_fractions(
    drafted: dict[tuple[int, int], int], accepted: dict[tuple[int, int], int]
) -> dict[tuple[int, int], float]:
    """(worker, k) → rejected fraction of draft tokens, from the drafted and accepted counts."""
    return {key: 1.0 - min(accepted.get(key, 0) / n, 1.0) for key, n in drafted.items() if n > 0}


def rejected_seconds(extra_s: dict[tuple[int, int], float], rejected_frac: dict[tuple[int, int], float]) -> float:
    """Seconds spent verifying rejected drafts: per (worker, k), the extra verify seconds of its steps (summed in
    step order) × that (worker, k)'s rejected fraction, summed in key order (so a streamed run sums the same)."""
    return sum(total * rejected_frac.get(key, 0.0) for key, total in sorted(extra_s.items()))


def cost_split(raw: RawRun, profile: Profile, start: float, end: float) -> tuple[CostSplit, float, float]:
    """(USD/Mtok split, drafter share, rejected-draft share) over the window."""
    steps = [s for s in raw.records.steps if start < s.end_s <= end]
    busy = sum(s.duration_s for s in steps)
    drafter = sum(s.drafter_s for s in steps)
    extra: dict[tuple[int, int, int], float] = {}
    extra_s: dict[tuple[int, int], float] = defaultdict(float)
    for s in steps:
        if s.k > 0 and s.decode_seqs > 0:
            shape = (s.decode_seqs, s.k, s.prefill_tokens)
            if shape not in extra:
                extra[shape] = extra_verify_s(profile, *shape)
            extra_s[s.worker, s.k] += extra[shape]
    rejected = rejected_seconds(extra_s, _rejected_fraction(steps))
    return price_split(
        raw.scenario, start, end, busy=busy, drafter=drafter, rejected=rejected, tokens=sum(s.tokens for s in steps)
    )


def price_split(
    sc: Scenario, start: float, end: float, *, busy: float, drafter: float, rejected: float, tokens: int
) -> tuple[CostSplit, float, float]:
    """``cost_split`` from the window's busy, drafter and rejected-draft seconds and its output tokens."""
    usd_per_s = sc.gpus * sc.usd_per_gpu_hour / 3600.0
    worker_seconds = sc.workers * (end - start)
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
    good = verdicts(raw)
    judged = [(r, g) for r, g in zip(raw.records.requests, good, strict=True) if start <= r.arrival_s < end]
    reqs = [r for r, _ in judged]
    finished = [r for r in reqs if r.finished]
    in_window = sum(1 for r in finished if r.finish_s <= end)
    steps = raw.records.steps
    decode = [s for s in steps if start < s.end_s <= end and s.k > 0 and s.prefill_tokens == 0 and s.decode_seqs]
    decoding = [s for s in steps if start < s.end_s <= end and s.decode_seqs > 0]
    attainment: dict[str, float] = {}
    for tier in sorted({r.tag for r in reqs}):
        mine = [g for r, g in judged if r.tag == tier and g is not None]
        attainment[tier] = sum(mine) / len(mine) if mine else math.nan
    split, drafter_share, rejected_share = cost_split(raw, profile, start, end)
    worker_minutes = sc.workers * window / 60.0
    tpots = [r.tpot_s for r in finished if not math.isnan(r.tpot_s)]
    return RunMetrics(
        scenario=sc.name,
        policy=raw.policy,
        window_s=window,
        throughput_tok_s=_step_tokens(steps, start, end) / window,
        goodput_tok_s=delivered_tokens(raw, start, end, good) / window,
        sla_attainment=attainment,
        requests_finished=in_window,
        requests_unfinished=len(reqs) - in_window,
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
        phases=phase_metrics(raw, good),
        ticks=raw.ticks,
        model_cost=raw.model_cost,
        backlog=backlog(raw, start, end),
    )
