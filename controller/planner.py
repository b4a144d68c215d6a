"""The fleet planner (DESIGN §9): which workers serve which traffic classes, at which gear and batch cap.

A pure function of what the controller measures: per traffic class (``"<tier>/<workload>"``) its arrival rate
and mean prompt and output lengths (from the usage ledger), its accepted length per k and that estimate's
uncertainty (``estimate_acceptance``), the tiers' SLA targets, and the profile's step-time model
(``fleet.perf.predict_step``). ``plan_fleet`` returns a ``fleet.plan.FleetPlan``.

**Steady-state model of one pool** (``evaluate_pool``). ``n`` identical workers share the pool's classes
equally; each runs draft length ``k`` with at most ``cap`` sequences at once. A request of class c needs
``O_c / AL_c(k)`` steps, so a worker offered ``λ_c / n`` requests/s of each class demands
``D = Σ_c (λ_c / n) · O_c / AL_c(k)`` sequence-steps per second, and by Little's law its mean running batch
solves ``B = D · T(B)``, ``T`` the step time (prefill of ``Σ_c (λ_c / n) · P_c · T`` prompt tokens per step
included), found by fixed-point iteration. A pool whose ``B`` would pass ``max_utilisation · cap`` is
*saturated*: it runs at ``B = cap``; its classes with a TPOT target are served first (the tiers' priority),
at most ``max_utilisation`` of the ``cap / T(cap)`` sequence-steps per second, and the classes without one
share what is left (their backlog grows). A class with a TPOT target counts as met when
``T(B) / AL_c ≤ (1 − tpot_margin) · target`` with ``AL_c`` taken ``acceptance_z`` standard deviations low;
its goodput is then its offered tokens (``λ_c · O_c``), else 0. A class without targets counts what it is
served.

**Candidates** (``candidates``): one shared pool (k None: the per-worker loops decide, as today), and every
split of the classes into an *interactive* pool (the classes with a TPOT target) and a *batch* pool (the
rest), for every pool size, gear (the workers' full-speed gears) and cap. Batch overflow the batch pool cannot
serve spills onto interactive workers while their predicted TPOT stays inside ``(1 − spill_margin)`` ×
the interactive target (the gateway's one-way spill rule), which the model counts. A split's pools always
carry their cap (``max_concurrency``, ``max_num_seqs`` included), since the gateway spills only from a pool
whose workers are at their cap. The shared pool is judged as the per-worker controller judges itself
(``shared_view``: mean TPOT within the target), a split with the margins above, and a split is chosen only
where it beats the shared pool by ``split_gain``: today's behaviour unless placement clearly pays.

**Stability** (``plan_fleet``): a new plan replaces the current one only when its predicted goodput beats the
current plan's (re-evaluated on today's inputs) by ``hysteresis``, and the current plan has held for
``min_dwell_s``; otherwise the current pools are republished. With one worker or one class the plan is one
pool with k None: today's controller.

Units: seconds, tokens, requests/s, tokens/s.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from fleet.config import TierConfig
from fleet.perf import Profile, conditional_acceptance, expected_tokens_per_step, predict_step
from fleet.plan import FleetPlan, PoolPlan, TrafficClass

SHARED_POOL = "shared"
INTERACTIVE_POOL = "interactive"
BATCH_POOL = "batch"
SPILL_LIMIT_KEY = "spill_limit/"
"""``FleetPlan.predicted["spill_limit/<pool>"]``: the in-flight requests per worker of a pool up to which its
predicted TPOT stays inside ``(1 − spill_margin)`` × its tightest TPOT target (the batch spill bound)."""


@dataclass(frozen=True, slots=True)
class ClassLoad:
    """One traffic class as the controller measures it."""

    name: TrafficClass
    tier: TierConfig
    rate_req_s: float
    """Arrivals, requests/s (whole fleet)."""
    prompt_tokens: float
    """Mean prompt length, tokens."""
    output_tokens: float
    """Mean output length (requested ``max_tokens``), tokens."""
    accepted_length: tuple[float, ...]
    """Expected tokens per sequence per step at k = 0, 1, …, k_max (``[0]`` is 1)."""
    accepted_length_sd: float = 0.0
    """Standard deviation of the estimate of the accepted drafts per step, as a fraction of them (0.1 = ±10 %)."""

    @property
    def tpot_target_s(self) -> float | None:
        return self.tier.tpot_target_s

    def al(self, k: int, *, z: float = 0.0) -> float:
        """Accepted length at ``k``, ``z`` standard deviations below the estimate (never below 1)."""
        base = self.accepted_length[min(k, len(self.accepted_length) - 1)]
        return max(1.0, 1.0 + (base - 1.0) * (1.0 - z * self.accepted_length_sd))


def prior_accepted_length(profile: Profile, workload: str, context_tokens: float) -> tuple[float, ...]:
    """The profile's accepted length per k (0 … k_max) for ``workload`` at ``context_tokens`` of context."""
    cond = conditional_acceptance(profile, workload, context_tokens)
    return tuple(expected_tokens_per_step(cond, k) for k in range(profile.drafter.k_max + 1))


@dataclass(frozen=True, slots=True)
class WorkerAcceptance:
    """What one worker's counters said over a window: its k, its accepted drafts per step, and the share of its
    request-steps each class had (from the requests routed to it)."""

    k: int
    accepted_per_step: float
    """Mean accepted drafts per request-step (accepted / drafts × k ... i.e. AL − 1), at ``k``."""
    shares: Mapping[TrafficClass, float]
    """Class → share of the worker's request-steps, summing to 1."""


def estimate_acceptance(
    priors: Mapping[TrafficClass, tuple[float, ...]], observed: Sequence[WorkerAcceptance], *, prior_sd: float = 0.15
) -> dict[TrafficClass, tuple[tuple[float, ...], float]]:
    """Per class: the prior accepted length per k corrected by a factor θ on its accepted drafts, and the
    factor's uncertainty (a fraction). Each worker at k > 0 gives one ratio observed / predicted accepted drafts,
    credited to its classes by share; θ_c is the share-weighted mean ratio, its sd the share-weighted spread over
    √(effective workers), or ``prior_sd`` with fewer than two observations."""
    out: dict[TrafficClass, tuple[tuple[float, ...], float]] = {}
    ratios: dict[TrafficClass, list[tuple[float, float]]] = {c: [] for c in priors}
    for w in observed:
        if w.k <= 0:
            continue
        predicted = sum(s * (priors[c][min(w.k, len(priors[c]) - 1)] - 1.0) for c, s in w.shares.items() if c in priors)
        if predicted <= 0:
            continue
        for c, s in w.shares.items():
            if c in ratios and s > 0:
                ratios[c].append((w.accepted_per_step / predicted, s))
    for c, prior in priors.items():
        obs = ratios[c]
        weight = sum(s for _, s in obs)
        if weight <= 0:
            out[c] = (prior, prior_sd)
            continue
        theta = sum(r * s for r, s in obs) / weight
        effective = weight**2 / sum(s * s for _, s in obs)
        if effective < 2:
            sd = prior_sd
        else:
            var = sum(s * (r - theta) ** 2 for r, s in obs) / weight
            sd = math.sqrt(var / effective) / max(theta, 1e-9)
        out[c] = (tuple(1.0 + (a - 1.0) * theta for a in prior), sd)
    return out


@dataclass(frozen=True)
class PlannerConfig:
    """How the planner decides (controller settings feed it)."""

    period_s: float = 20.0
    """Seconds between plans."""
    min_dwell_s: float = 60.0
    """A plan holds at least this long before the pools may change."""
    hysteresis: float = 0.05
    """A new plan must predict this much more goodput than the current one (0.05 = +5 %)."""
    split_gain: float = 0.05
    """A plan of several pools must predict this much more goodput than the shared pool (the model's error
    margin: below it, today's per-worker controller keeps the whole fleet)."""
    ttl_s: float = 90.0
    """The published plan's TTL, seconds (readers ignore it afterwards)."""
    spill_margin: float = 0.2
    tpot_margin: float = 0.1
    """A class's predicted TPOT must stay below ``(1 − tpot_margin)`` × its target."""
    max_utilisation: float = 0.85
    """A pool is saturated past this share of its workers' capacity (queues then grow)."""
    acceptance_z: float = 1.0
    """TPOT checks use the accepted length this many standard deviations below its estimate."""
    caps: tuple[int | None, ...] = (None, 16, 32, 64)
    """Per-worker concurrency caps tried (None: ``max_num_seqs``); caps at or above ``max_num_seqs`` drop out."""
    context_fraction: float = 0.5
    """A decoding sequence's mean context is its prompt plus this share of its output, tokens."""


@dataclass(frozen=True)
class PlannerInput:
    model: str
    workers: tuple[str, ...]
    profile: Profile
    classes: tuple[ClassLoad, ...]
    now: float
    """Unix seconds."""
    max_num_seqs: int
    current: FleetPlan | None = None
    current_since: float = 0.0
    """When ``current``'s pools were first issued (its version), Unix seconds."""
    gears: tuple[int, ...] | None = None
    """The k every worker runs at full speed (None: 0 … k_max)."""


@dataclass(frozen=True, slots=True)
class PoolEstimate:
    """The model's steady state of one pool."""

    goodput_tok_s: float
    throughput_tok_s: float
    batch: float
    """Mean running sequences per worker."""
    tpot_s: dict[TrafficClass, float]
    saturated: bool
    spare_seq_steps: float
    """Sequence-steps per second the pool could still serve within ``max_utilisation`` (all workers)."""


def _step_s(profile: Profile, batch: float, k: int, context: float, prefill_rate: float) -> float:
    """Step time at ``batch`` with ``prefill_rate`` prompt tokens/s arriving (fixed point in the step time)."""
    t = predict_step(profile, batch=batch, k=k, context_per_seq=context).total_s
    for _ in range(2):
        t = predict_step(profile, batch=batch, k=k, context_per_seq=context, prefill_per_step=prefill_rate * t).total_s
    return t


def evaluate_pool(
    profile: Profile,
    loads: Sequence[tuple[ClassLoad, float]],
    *,
    workers: int,
    k: int,
    cap: int,
    cfg: PlannerConfig,
) -> PoolEstimate:
    """The steady state of ``workers`` workers at ``k`` with ``cap`` sequences each, serving ``loads`` (class,
    requests/s sent to this pool); see the module docstring."""
    live = [(c, r) for c, r in loads if r > 0]
    if not live or workers <= 0:
        return PoolEstimate(0.0, 0.0, 0.0, {}, False, 0.0)
    per_worker = [(c, r / workers) for c, r in live]
    demand = sum(r * c.output_tokens / c.al(k) for c, r in per_worker)
    prompt_rate = sum(r * c.prompt_tokens for c, r in per_worker)
    context = sum(r * (c.prompt_tokens + cfg.context_fraction * c.output_tokens) for c, r in per_worker) / sum(
        r for _, r in per_worker
    )
    batch = 1.0
    for _ in range(40):
        nxt = demand * _step_s(profile, batch, k, context, prompt_rate)
        if nxt > cap:
            batch = float(cap)
            break
        if abs(nxt - batch) < 1e-3:
            batch = nxt
            break
        batch = nxt
    step = _step_s(profile, max(batch, 1.0), k, context, prompt_rate)
    capacity = cfg.max_utilisation * cap / _step_s(profile, cap, k, context, prompt_rate)
    saturated = demand > capacity
    if saturated:
        batch = float(cap)
        step = _step_s(profile, cap, k, context, prompt_rate)
    tpots = {c.name: step / c.al(k, z=cfg.acceptance_z) for c, _ in per_worker}
    good, thru, left = 0.0, 0.0, capacity
    for c, r in sorted(per_worker, key=lambda cr: cr[0].tpot_target_s is None):
        need = r * c.output_tokens / c.al(k)
        served = min(need, max(left, 0.0))
        left -= need
        tokens = served * c.al(k)
        thru += tokens
        target = c.tpot_target_s
        if target is None or (served >= need and tpots[c.name] <= (1.0 - cfg.tpot_margin) * target):
            good += tokens
    return PoolEstimate(
        goodput_tok_s=good * workers,
        throughput_tok_s=thru * workers,
        batch=batch,
        tpot_s=tpots,
        saturated=saturated,
        spare_seq_steps=max(left, 0.0) * workers,
    )


def spill_limit(
    profile: Profile, loads: Sequence[tuple[ClassLoad, float]], *, workers: int, k: int, cap: int, cfg: PlannerConfig
) -> int:
    """The most sequences one worker of the pool may run while every class's predicted TPOT with a target stays
    inside ``(1 − spill_margin)`` × that target (``cap`` when no class has a target; 0 when even one fails)."""
    live = [(c, r / max(workers, 1)) for c, r in loads if r > 0]
    targets = [(t, c.al(k, z=cfg.acceptance_z)) for c, _ in live if (t := c.tpot_target_s) is not None]
    if not targets:
        return cap
    rate = sum(r for _, r in live)
    context = sum(r * (c.prompt_tokens + cfg.context_fraction * c.output_tokens) for c, r in live) / rate
    prompt_rate = sum(r * c.prompt_tokens for c, r in live)

    def fits(b: int) -> bool:
        step = _step_s(profile, b, k, context, prompt_rate)
        return all(step / al <= (1.0 - cfg.spill_margin) * t for t, al in targets)

    if not fits(1):
        return 0
    lo, hi = 1, cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


@dataclass(frozen=True)
class Candidate:
    """One way to place the fleet, with its predicted steady state."""

    pools: tuple[PoolPlan, ...]
    goodput_tok_s: float
    estimates: dict[str, PoolEstimate] = field(default_factory=dict)
    spilled_tok_s: float = 0.0
    """Batch tokens/s the model expects the interactive pool to absorb."""


def shared_view(cfg: PlannerConfig) -> PlannerConfig:
    """How a pool left to the per-worker loops (k None) is judged: as the controller judges itself, the mean
    TPOT within the target (no margin, the acceptance at its estimate)."""
    return replace(cfg, tpot_margin=0.0, acceptance_z=0.0)


def _caps(cfg: PlannerConfig, max_num_seqs: int) -> list[int]:
    return sorted({max_num_seqs if c is None or c >= max_num_seqs else c for c in cfg.caps})


def _best_pool(
    profile: Profile,
    loads: Sequence[tuple[ClassLoad, float]],
    workers: int,
    gears: Sequence[int],
    caps: Sequence[int],
    cfg: PlannerConfig,
) -> tuple[int, int, PoolEstimate]:
    """The (k, cap) with the highest predicted goodput (ties: more spare capacity, then the larger cap)."""
    best: tuple[tuple[float, float, int], int, int, PoolEstimate] | None = None
    for k in gears:
        for cap in caps:
            est = evaluate_pool(profile, loads, workers=workers, k=k, cap=cap, cfg=cfg)
            key = (round(est.goodput_tok_s, 6), est.spare_seq_steps, cap)
            if best is None or key > best[0]:
                best = (key, k, cap, est)
    assert best is not None
    return best[1], best[2], best[3]


def _spill(
    profile: Profile,
    interactive: Sequence[tuple[ClassLoad, float]],
    batch_est: PoolEstimate,
    batch_loads: Sequence[tuple[ClassLoad, float]],
    n: int,
    k: int,
    cap: int,
    cfg: PlannerConfig,
) -> tuple[float, PoolEstimate]:
    """Batch tokens/s the interactive pool can take on top of its own load within the spill margin, and the
    interactive pool's estimate with that spill."""
    offered = sum(r * c.output_tokens for c, r in batch_loads)
    unserved = max(offered - batch_est.throughput_tok_s, 0.0)
    base = evaluate_pool(profile, interactive, workers=n, k=k, cap=cap, cfg=cfg)
    if unserved <= 0 or not batch_loads:
        return 0.0, base
    spill_cfg = replace(cfg, tpot_margin=cfg.spill_margin)
    lo, hi, best = 0.0, 1.0, base
    for _ in range(8):
        mid = (lo + hi) / 2
        extra = [(c, r * mid * unserved / offered) for c, r in batch_loads]
        est = evaluate_pool(profile, [*interactive, *extra], workers=n, k=k, cap=cap, cfg=spill_cfg)
        own = sum(r * c.output_tokens for c, r in interactive)
        if not est.saturated and est.goodput_tok_s >= own + sum(r * c.output_tokens for c, r in extra) - 1e-6:
            lo, best = mid, est
        else:
            hi = mid
    return lo * unserved, best


def candidates(inp: PlannerInput, cfg: PlannerConfig) -> list[Candidate]:
    """Every placement the planner considers, each with its predicted goodput (see the module docstring)."""
    profile, workers = inp.profile, list(inp.workers)
    gears = list(inp.gears if inp.gears is not None else range(profile.drafter.k_max + 1))
    caps = _caps(cfg, inp.max_num_seqs)
    all_loads = [(c, c.rate_req_s) for c in inp.classes]
    names = [c.name for c in inp.classes]
    _, _, shared = _best_pool(profile, all_loads, len(workers), gears, [inp.max_num_seqs], shared_view(cfg))
    out = [Candidate((PoolPlan(name=SHARED_POOL, classes=names, workers=workers),), shared.goodput_tok_s,
                     {SHARED_POOL: shared})]  # fmt: skip
    inter = [(c, r) for c, r in all_loads if c.tpot_target_s is not None]
    batch = [(c, r) for c, r in all_loads if c.tpot_target_s is None]
    if len(workers) < 2 or not inter or not batch:
        return out
    for n_i in range(1, len(workers)):
        n_b = len(workers) - n_i
        k_b, cap_b, est_b = _best_pool(profile, batch, n_b, gears, caps, cfg)
        for k_i, cap_i in itertools.product(gears, caps):
            spilled, est_i = _spill(profile, inter, est_b, batch, n_i, k_i, cap_i, cfg)
            pools = (
                PoolPlan(
                    name=INTERACTIVE_POOL,
                    classes=[c.name for c, _ in inter],
                    workers=workers[:n_i],
                    k=k_i,
                    max_concurrency=cap_i,
                ),
                PoolPlan(
                    name=BATCH_POOL,
                    classes=[c.name for c, _ in batch],
                    workers=workers[n_i:],
                    k=k_b,
                    max_concurrency=cap_b,
                ),
            )
            total = est_i.goodput_tok_s + est_b.goodput_tok_s
            out.append(Candidate(pools, total, {INTERACTIVE_POOL: est_i, BATCH_POOL: est_b}, spilled))
    return out


def _evaluate_plan(inp: PlannerInput, plan: FleetPlan, cfg: PlannerConfig) -> float | None:
    """The current plan's predicted goodput on today's inputs (None when it no longer fits the fleet or the
    classes: then it must be replaced)."""
    if sorted(w for p in plan.pools for w in p.workers) != sorted(inp.workers):
        return None
    by_name = {c.name: c for c in inp.classes}
    if any(not plan.pools_for(name) for name in by_name):
        return None
    gears = list(inp.gears if inp.gears is not None else range(inp.profile.drafter.k_max + 1))
    total = 0.0
    for pool in plan.pools:
        loads = [(c, c.rate_req_s) for c in inp.classes if pool.serves(c.name)]
        cap = pool.max_concurrency or inp.max_num_seqs
        if pool.k is None:
            total += _best_pool(inp.profile, loads, len(pool.workers), gears, [cap], shared_view(cfg))[2].goodput_tok_s
        else:
            est = evaluate_pool(inp.profile, loads, workers=len(pool.workers), k=pool.k, cap=cap, cfg=cfg)
            total += est.goodput_tok_s
    return total


def _choose(cands: Sequence[Candidate], cfg: PlannerConfig) -> Candidate:
    """The highest predicted goodput, a split counted only where it beats the shared pool (``cands[0]``) by
    ``split_gain``; within 1 % of it, the fewest pools, then the most spare capacity."""
    shared = cands[0]
    cands = [shared, *(c for c in cands[1:] if c.goodput_tok_s >= (1.0 + cfg.split_gain) * shared.goodput_tok_s)]
    top = max(c.goodput_tok_s for c in cands)
    near = [c for c in cands if c.goodput_tok_s >= 0.99 * top]
    return max(
        near,
        key=lambda c: (-len(c.pools), sum(e.spare_seq_steps for e in c.estimates.values()), c.goodput_tok_s),
    )


def _predicted(inp: PlannerInput, cand: Candidate, cfg: PlannerConfig) -> dict[str, float]:
    """The plan's ``predicted``: goodput, spilled tokens, and per pool its batch, per-class TPOT and (pools at a
    fixed k) its spill limit."""
    out = {"goodput_tok_s": round(cand.goodput_tok_s, 3), "spilled_tok_s": round(cand.spilled_tok_s, 3)}
    for pool in cand.pools:
        est = cand.estimates[pool.name]
        out[f"batch/{pool.name}"] = round(est.batch, 3)
        for cls, tpot in est.tpot_s.items():
            out[f"tpot_s/{pool.name}/{cls}"] = round(tpot, 5)
        if pool.k is not None:
            loads = [(c, c.rate_req_s) for c in inp.classes if pool.serves(c.name)]
            cap = pool.max_concurrency or inp.max_num_seqs
            limit = spill_limit(inp.profile, loads, workers=len(pool.workers), k=pool.k, cap=cap, cfg=cfg)
            out[f"{SPILL_LIMIT_KEY}{pool.name}"] = float(limit)
    return out


def _describe(cand: Candidate) -> str:
    parts = []
    for p in cand.pools:
        gear = "k by its loop" if p.k is None else f"k={p.k}"
        cap = f", cap {p.max_concurrency}" if p.max_concurrency else ""
        parts.append(f"{p.name}: {len(p.workers)} worker(s), {gear}{cap}, {'+'.join(p.classes)}")
    return "; ".join(parts) + f"; predicted goodput {cand.goodput_tok_s:.0f} tok/s"


def _plan(inp: PlannerInput, pools: Sequence[PoolPlan], version: int, reason: str, predicted: dict[str, float],
          cfg: PlannerConfig) -> FleetPlan:  # fmt: skip
    return FleetPlan(
        model=inp.model,
        version=version,
        issued_at=inp.now,
        ttl_s=cfg.ttl_s,
        pools=list(pools),
        spill_margin=cfg.spill_margin,
        reason=reason,
        predicted=predicted,
    )


def plan_fleet(inp: PlannerInput, cfg: PlannerConfig | None = None) -> FleetPlan:
    """The plan for ``inp`` (see the module docstring): the best candidate, or the current plan republished
    when the best does not beat it by ``hysteresis`` or the current plan is younger than ``min_dwell_s``."""
    cfg = cfg or PlannerConfig()
    cands = candidates(inp, cfg)
    best = _choose(cands, cfg)
    current = inp.current
    if current is None:
        return _plan(inp, best.pools, 1, "first plan: " + _describe(best), _predicted(inp, best, cfg), cfg)
    held = _evaluate_plan(inp, current, cfg)
    same = [(p.name, p.classes, p.workers, p.k, p.max_concurrency) for p in current.pools] == [
        (p.name, p.classes, p.workers, p.k, p.max_concurrency) for p in best.pools
    ]
    if held is not None and not same:
        young = inp.now - inp.current_since < cfg.min_dwell_s
        small = best.goodput_tok_s <= held * (1.0 + cfg.hysteresis)
        if young or small:
            why = f"held {inp.now - inp.current_since:.0f} s < dwell {cfg.min_dwell_s:.0f} s" if young else (
                f"best {best.goodput_tok_s:.0f} tok/s is within {cfg.hysteresis:.0%} of the current {held:.0f}"
            )  # fmt: skip
            predicted = {**current.predicted, "goodput_tok_s": round(held, 3)}
            return _plan(inp, current.pools, current.version, f"kept ({why}): {current.reason}", predicted, cfg)
    version = current.version if same else current.version + 1
    return _plan(inp, best.pools, version, _describe(best), _predicted(inp, best, cfg), cfg)
