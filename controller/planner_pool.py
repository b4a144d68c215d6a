"""The fleet planner's model of one pool (DESIGN §9): a traffic class's load and acceptance, and the steady state
of ``n`` identical workers serving a set of classes at one drafter mode, gear and cap (``evaluate_pool``).

**Steady-state model of one pool.** ``n`` identical workers share the pool's classes equally; each runs draft
length ``k`` with at most ``cap`` sequences at once. A request of class c needs ``O_c / AL_c(k)`` steps, so a
worker offered ``λ_c / n`` requests/s of each class demands ``D = Σ_c (λ_c / n) · O_c / AL_c(k)`` sequence-steps
per second, and by Little's law its mean running batch solves ``B = D · T(B)``, ``T`` the step time (prefill of
``Σ_c (λ_c / n) · P_c · T`` prompt tokens per step included), found by fixed-point iteration. The step time is the
profile's (``fleet.perf.predict_step``) for the pool's **drafter mode**: a pool with its drafter loaded pays the
idle-drafter tax at k = 0 (``PlannerConfig.idle_drafter``: vLLM's stock term or the gearshift plugin's), a
drafter-free pool (``drafter = "off"``, k = 0 only) pays none. A pool whose ``B`` would pass
``max_utilisation · cap`` is *saturated*: it runs at ``B = cap``; its classes with a TPOT target are served first
(the tiers' priority), at most ``max_utilisation`` of the ``cap / T(cap)`` sequence-steps per second, and the
classes without one share what is left (their backlog grows). A class with a TPOT target counts as met when
``T(B) / AL_c ≤ (1 − tpot_margin) · target`` with ``AL_c`` taken ``acceptance_z`` standard deviations low; its
goodput is then its offered tokens (``λ_c · O_c``), else 0. A class without targets counts what it is served.

Units: seconds, tokens, requests/s, tokens/s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from fleet.config import SpeculationMode, TierConfig
from fleet.perf import IdleDrafterMode, Profile, conditional_acceptance, expected_tokens_per_step, predict_step
from fleet.plan import DrafterMode, TrafficClass


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

    @property
    def speculation_off(self) -> bool:
        """The tier asks for no speculation: only a pool decoding at k = 0 may serve it."""
        return self.tier.speculation is SpeculationMode.OFF

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
    idle_drafter: IdleDrafterMode = IdleDrafterMode.STOCK
    """The k = 0 tax a pool with its drafter loaded pays (``fleet.perf.IdleDrafterMode``)."""
    horizon_s: float | None = None
    """Seconds a plan's gain over the one it replaces is counted over (None: ``horizon_factor`` × restart_s)."""
    horizon_factor: float = 10.0
    move_margin: float = 0.1
    """A plan that restarts workers must gain, over the horizon, this much more than the restarts cost."""


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


def _step_s(
    profile: Profile,
    batch: float,
    k: int,
    context: float,
    prefill_rate: float,
    drafter: DrafterMode,
    cfg: PlannerConfig,
) -> float:
    """Step time at ``batch`` with ``prefill_rate`` prompt tokens/s arriving (fixed point in the step time), on a
    worker in ``drafter`` mode."""
    loaded = drafter == "loaded"

    def at(prefill: float) -> float:
        return predict_step(
            profile, batch=batch, k=k, context_per_seq=context, prefill_per_step=prefill, drafter_loaded=loaded,
            idle_drafter=cfg.idle_drafter,
        ).total_s  # fmt: skip

    t = at(0.0)
    for _ in range(2):
        t = at(prefill_rate * t)
    return t


def evaluate_pool(
    profile: Profile,
    loads: Sequence[tuple[ClassLoad, float]],
    *,
    workers: int,
    k: int,
    cap: int,
    cfg: PlannerConfig,
    drafter: DrafterMode = "loaded",
) -> PoolEstimate:
    """The steady state of ``workers`` workers at ``k`` with ``cap`` sequences each in ``drafter`` mode, serving
    ``loads`` (class, requests/s sent to this pool); see the module docstring."""
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
        nxt = demand * _step_s(profile, batch, k, context, prompt_rate, drafter, cfg)
        if nxt > cap:
            batch = float(cap)
            break
        if abs(nxt - batch) < 1e-3:
            batch = nxt
            break
        batch = nxt
    step = _step_s(profile, max(batch, 1.0), k, context, prompt_rate, drafter, cfg)
    capacity = cfg.max_utilisation * cap / _step_s(profile, cap, k, context, prompt_rate, drafter, cfg)
    saturated = demand > capacity
    if saturated:
        batch = float(cap)
        step = _step_s(profile, cap, k, context, prompt_rate, drafter, cfg)
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
    profile: Profile,
    loads: Sequence[tuple[ClassLoad, float]],
    *,
    workers: int,
    k: int,
    cap: int,
    cfg: PlannerConfig,
    drafter: DrafterMode = "loaded",
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
        step = _step_s(profile, b, k, context, prompt_rate, drafter, cfg)
        return all(step / al <= (1.0 - cfg.spill_margin) * t for t, al in targets)

    if not fits(1):
        return 0
    lo, hi = 1, cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def shared_view(cfg: PlannerConfig) -> PlannerConfig:
    """How a pool left to the per-worker loops (k None) is judged: as the controller judges itself, the mean
    TPOT within the target (no margin, the acceptance at its estimate)."""
    return replace(cfg, tpot_margin=0.0, acceptance_z=0.0)
