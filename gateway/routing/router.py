"""Routing: filters → weighted scorers → pick (STYLE 7).

Every filter and scorer has one async signature and sees the same ``RouteContext``. Scores lie in [0, 1];
the router adds them with weights from the settings and orders the candidates best first (the first is
used, the rest are the retry order). With no controller running there is no published state: the queue
scorer then uses the gateway's own in-flight count (and outstanding prompt tokens) per worker, and the
other scorers give every worker the same score, so routing falls back to least-loaded. The TTFT scorer
predicts each worker's time to first token from the prompt tokens outstanding there and its prefill rate.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from fleet.config import FleetConfig, SpeculationPreference, TierConfig
from fleet.perf import Profile, StepShape, step_time, worker_profiles
from fleet.plan import FleetPlan, TrafficClass
from gateway.routing.draining import NotDrainingFilter
from gateway.routing.pool import WorkerView


@dataclass(frozen=True, slots=True)
class RouteContext:
    model: str
    tier: TierConfig
    now: float
    """Unix seconds."""
    prompt_tokens: int = 0
    """The request's estimated prompt tokens (the prefill it adds to the worker it goes to)."""
    traffic_class: TrafficClass | None = None
    """``"<tier>/<workload>"`` (``fleet.plan.traffic_class``); None: unknown (placement keeps every worker)."""
    plan: FleetPlan | None = None
    """The latest fleet plan the gateway read for ``model``, fresh or not (``gateway.routing.placement`` checks)."""
    prefix_blocks: tuple[int, ...] = ()
    """Chained hashes of the prompt's leading blocks, computed once per request (``gateway.routing.prefix``)."""


class Filter(Protocol):
    name: str

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[WorkerView]: ...


class Scorer(Protocol):
    name: str

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[float]:
        """One score in [0, 1] per worker, higher is better."""
        ...


# ------------------------------------------------------------------------------------------------ filters
class ModelFilter:
    """Keep workers that serve the requested model."""

    name = "model"

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[WorkerView]:
        return [w for w in workers if w.config.model == ctx.model]


class HealthyFilter:
    """Keep workers whose last health probe passed and whose connections are not being refused."""

    name = "healthy"

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[WorkerView]:
        return [w for w in workers if w.healthy]


class NotEjectedFilter:
    """Keep workers not ejected (by this gateway or, through the store, by any replica)."""

    name = "not-ejected"

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[WorkerView]:
        return [w for w in workers if w.ejected_until <= ctx.now]


# ------------------------------------------------------------------------------------------------ scorers
DEFAULT_PREFILL_TOKENS_PER_SLOT = 1024
"""Outstanding prompt tokens that weigh as much as one request (``GatewaySettings.prefill_tokens_per_slot``)."""


def load_of(worker: WorkerView) -> float:
    """Requests on the worker: the controller's published running + waiting, or this gateway's own in-flight
    count when it is larger (published state lags by up to a scrape interval)."""
    published = worker.state.running + worker.state.waiting if worker.state else 0.0
    return max(published, float(worker.in_flight))


class QueueScorer:
    """``max_num_seqs / (max_num_seqs + load + prefill_tokens / prefill_tokens_per_slot)`` with
    ``load = max(running + waiting, own in-flight)`` (requests) and ``prefill_tokens`` the estimated prompt
    tokens of this gateway's requests on the worker not yet answered with a first byte, counted as
    ``prefill_tokens_per_slot`` tokens per slot (a worker prefilling a 150 k-token prompt admits new requests only
    after it): 1 when idle, ½ at one batch of work, and never flat. It must not saturate: within a burst the
    gateway's own counts are the only signal that moves (published state is a tick old), and a clipped score
    (0 for every worker past a full batch, e.g. four 8 k-token prompts on a 32-sequence worker) would leave the
    burst's placement to the stale signals."""

    name = "queue"

    def __init__(self, *, prefill_tokens_per_slot: int = DEFAULT_PREFILL_TOKENS_PER_SLOT) -> None:
        if prefill_tokens_per_slot <= 0:
            raise ValueError(f"prefill_tokens_per_slot: must be positive, got {prefill_tokens_per_slot}")
        self._per_slot = prefill_tokens_per_slot

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[float]:
        return [
            w.config.max_num_seqs / (w.config.max_num_seqs + load_of(w) + w.prefill_tokens / self._per_slot)
            for w in workers
        ]


class KvCacheScorer:
    """``1 − kv_usage`` (the published KV-cache fraction in use); 1 when unknown."""

    name = "kv-cache"

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[float]:
        return [1.0 - min(1.0, max(0.0, w.state.kv_usage)) if w.state else 1.0 for w in workers]


def profile_prefill_rate(profile: Profile) -> float:
    """Prompt tokens per second a worker prefills with nothing else in the step: one chunked-prefill step of
    ``chunked_prefill_tokens`` over its predicted step time (``fleet.perf.step_time``, no speculation)."""
    chunk = profile.chunked_prefill_tokens
    return chunk / step_time(profile, StepShape(decode_seqs=0, k=0, context_tokens=0, prefill_tokens=chunk)).total_s


def prefill_rates(fleet: FleetConfig, *, override: float | None = None) -> dict[str, float]:
    """Worker id → prefill rate (tokens per second): ``override`` when set, else from its model's profile."""
    if override is not None:
        return {w.id: override for w in fleet.workers}
    by_profile: dict[int, float] = {}
    rates = {}
    for worker_id, profile in worker_profiles(fleet).items():
        if id(profile) not in by_profile:
            by_profile[id(profile)] = profile_prefill_rate(profile)
        rates[worker_id] = by_profile[id(profile)]
    return rates


DEFAULT_PREFILL_TOKENS_PER_S = 10_000.0
"""Prefill rate of a worker missing from the scorer's rates, tokens per second."""
DEFAULT_TTFT_REFERENCE_S = 2.0
"""TTFT scale for a tier without ``ttft_target_s`` (``GatewaySettings.ttft_reference_s``)."""


class TtftScorer:
    """``1 / (1 + predicted_ttft / target)`` with ``predicted_ttft = (prefill_tokens + prompt_tokens) / rate``
    (seconds): the prompt tokens this gateway has outstanding on the worker (not yet answered with a first byte)
    plus this request's, over the worker's prefill rate (tokens per second, from its profile or the settings),
    and ``target`` the tier's ``ttft_target_s`` (else ``reference_s``). A worker with nothing to prefill scores
    ``1 / (1 + prompt / (rate · target))``; one predicted to take the whole target scores 0.5."""

    name = "ttft"

    def __init__(
        self,
        *,
        rates: Mapping[str, float] | None = None,
        default_rate: float = DEFAULT_PREFILL_TOKENS_PER_S,
        reference_s: float = DEFAULT_TTFT_REFERENCE_S,
    ) -> None:
        if default_rate <= 0 or reference_s <= 0 or any(r <= 0 for r in (rates or {}).values()):
            raise ValueError("prefill rates and reference_s must be positive")
        self._rates = dict(rates or {})
        self._default_rate = default_rate
        self._reference_s = reference_s

    def predicted_ttft(self, ctx: RouteContext, worker: WorkerView) -> float:
        """Seconds until ``worker`` would have prefilled this request after the work queued before it."""
        rate = self._rates.get(worker.id, self._default_rate)
        return (worker.prefill_tokens + ctx.prompt_tokens) / rate

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[float]:
        target = ctx.tier.ttft_target_s or self._reference_s
        return [1.0 / (1.0 + self.predicted_ttft(ctx, w) / target) for w in workers]


NEUTRAL_SCORE = 0.5


class SpeculationScorer:
    """Fit of a worker's published speculation state to the tier's preference. For a tier with a preference,
    overloaded workers score 0; workers without published state score 0.5 (no opinion).

    - ``speed`` (interactive): relative per-user speed ``s / max(s)`` over the candidates, with
      ``s = 1 / tpot_predicted_s`` (or the accepted length when no TPOT is predicted), times
      ``target / tpot_predicted`` when the prediction misses the tier's TPOT target, times
      ``(1 + published) / (1 + max(published, now))``: the prediction was made at the published load
      (running + waiting, requests) and a worker's per-user speed falls about in proportion to the load added
      since (``now``: ``load_of`` plus outstanding prefill per ``prefill_tokens_per_slot``, as the queue scorer
      counts it). Without it a burst that arrives within one tick all goes to the worker that was fastest
      before it.
    - ``throughput`` (batch): the cheapest published cost scores 1, others ``min_cost / usd_per_mtok``;
      without published costs ``1 − k_applied / k_max`` — bulk work goes to workers already in a low gear,
      where extra batch costs little, and stays off the fast lanes whose high k it would knock down.
    - ``neutral``: 0.5 for every worker, overloaded or not: a tier without a preference is placed by load alone.
      The published ``overloaded`` flag is a tick old and binary; at this scorer's weight it would send a whole
      burst that arrives within one tick to the workers not flagged (the load scorers see the burst as it lands).
    """

    name = "speculation"

    def __init__(self, *, prefill_tokens_per_slot: int = DEFAULT_PREFILL_TOKENS_PER_SLOT) -> None:
        if prefill_tokens_per_slot <= 0:
            raise ValueError(f"prefill_tokens_per_slot: must be positive, got {prefill_tokens_per_slot}")
        self._per_slot = prefill_tokens_per_slot

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[float]:
        pref = ctx.tier.speculation
        if pref is SpeculationPreference.SPEED:
            scores = self._speed(ctx.tier, workers)
        elif pref is SpeculationPreference.THROUGHPUT:
            scores = self._throughput(workers)
        else:
            return [NEUTRAL_SCORE] * len(workers)
        return [0.0 if w.state and w.state.overloaded else s for w, s in zip(workers, scores, strict=True)]

    def _speed(self, tier: TierConfig, workers: Sequence[WorkerView]) -> list[float]:
        speeds: list[float | None] = []
        for w in workers:
            st = w.state
            if st is None:
                speeds.append(None)
            elif st.tpot_predicted_s:
                speeds.append(1.0 / st.tpot_predicted_s)
            else:
                speeds.append(max(st.accepted_length, 1.0))
        top = max((s for s in speeds if s is not None), default=0.0)
        out = []
        for w, s in zip(workers, speeds, strict=True):
            if s is None or top <= 0:
                out.append(NEUTRAL_SCORE)
                continue
            score = s / top
            tpot = w.state.tpot_predicted_s if w.state else None
            if tier.tpot_target_s and tpot and tpot > tier.tpot_target_s:
                score *= tier.tpot_target_s / tpot
            published = w.state.running + w.state.waiting if w.state else 0.0
            now = load_of(w) + w.prefill_tokens / self._per_slot
            out.append(score * (1.0 + published) / (1.0 + max(published, now)))
        return out

    @staticmethod
    def _throughput(workers: Sequence[WorkerView]) -> list[float]:
        costs = [w.state.usd_per_mtok for w in workers if w.state is not None]
        if costs and all(c is not None and c > 0 for c in costs):
            cheapest = min(c for c in costs if c is not None)
            return [
                cheapest / w.state.usd_per_mtok if w.state and w.state.usd_per_mtok else NEUTRAL_SCORE for w in workers
            ]
        return [
            1.0 - min(1.0, w.state.k_applied / w.config.drafter.k_max) if w.state else NEUTRAL_SCORE for w in workers
        ]


# --------------------------------------------------------------------------------------------------- pick
@dataclass(frozen=True, slots=True)
class Decision:
    """Candidates best first, with each one's total score (for the routing span)."""

    ranked: list[WorkerView]
    scores: dict[str, float]
    filtered_out: dict[str, str]
    """Worker id → the filter that removed it."""


class Router:
    """Applies the filters, adds the weighted scores and ranks the survivors."""

    def __init__(
        self, filters: Sequence[Filter], scorers: Sequence[tuple[Scorer, float]], *, rng: random.Random | None = None
    ) -> None:
        self._filters = list(filters)
        self._scorers = [(s, w) for s, w in scorers if w > 0]
        self._rng = rng or random.Random()

    async def route(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> Decision:
        candidates = list(workers)
        removed: dict[str, str] = {}
        for f in self._filters:
            kept = await f(ctx, candidates)
            kept_ids = {id(w) for w in kept}  # identity: comparing views field by field is slow
            removed.update({w.id: f.name for w in candidates if id(w) not in kept_ids})
            candidates = kept
        totals = [0.0] * len(candidates)
        for scorer, weight in self._scorers:
            for i, score in enumerate(await scorer(ctx, candidates)):
                totals[i] += weight * score
        # Ties go to the worker with fewer of our requests, then to a random one (spreads a cold start).
        keys = {w.id: (totals[i], -w.in_flight, self._rng.random()) for i, w in enumerate(candidates)}
        ranked = sorted(candidates, key=lambda w: keys[w.id], reverse=True)
        return Decision(ranked=ranked, scores={w.id: keys[w.id][0] for w in candidates}, filtered_out=removed)


def default_router(
    *,
    weight_queue: float,
    weight_kv: float,
    weight_speculation: float,
    weight_ttft: float = 0.0,
    prefill_tokens_per_slot: int = DEFAULT_PREFILL_TOKENS_PER_SLOT,
    prefill_rates: Mapping[str, float] | None = None,
    ttft_reference_s: float = DEFAULT_TTFT_REFERENCE_S,
    placement: Filter | None = None,
    prefix: Scorer | None = None,
    weight_prefix: float = 0.0,
    rng: random.Random | None = None,
) -> Router:
    """The gateway's router; ``weight_ttft`` 0 (the default here) leaves the TTFT scorer out, and ``placement``
    (``gateway.routing.placement.PlacementFilter``) None leaves routing on load alone; ``prefix``
    (``gateway.routing.prefix.PrefixScorer``) None leaves prefix affinity out."""
    queue = QueueScorer(prefill_tokens_per_slot=prefill_tokens_per_slot)
    ttft = TtftScorer(rates=prefill_rates, reference_s=ttft_reference_s)
    return Router(
        [ModelFilter(), HealthyFilter(), NotEjectedFilter(), NotDrainingFilter(), *([placement] if placement else [])],
        [
            (queue, weight_queue),
            (KvCacheScorer(), weight_kv),
            (SpeculationScorer(prefill_tokens_per_slot=prefill_tokens_per_slot), weight_speculation),
            (ttft, weight_ttft),
            *([(prefix, weight_prefix)] if prefix is not None else []),  # gateway.routing.prefix.PrefixScorer
        ],
        rng=rng,
    )
