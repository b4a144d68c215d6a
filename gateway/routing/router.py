"""The router (STYLE 7, in the shape of llm-d's scheduler): filters → weighted scorers → pick, then post-pick hooks.

Every plug-in has one signature and sees the same ``RouteContext`` (``gateway.routing.context``). Scores lie in
[0, 1]; the router adds them with weights from the settings and the picker orders the candidates best first.
With no controller running there is no published state: the queue scorer then uses the gateway's own in-flight
count (and outstanding prompt tokens) per worker, and the other scorers give every worker the same score, so
routing falls back to least-loaded.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from fleet.config import FleetConfig, TenantsConfig
from gateway.routing.context import Filter, PostPick, RouteContext, Scorer
from gateway.routing.filters.eligibility import ELIGIBILITY, ModelFilter
from gateway.routing.filters.placement import placement_filter
from gateway.routing.filters.speculation import SpeculationFilter
from gateway.routing.hooks import PrefixRecorder
from gateway.routing.picker import rank
from gateway.routing.pool import WorkerView
from gateway.routing.prefix import PrefixIndex
from gateway.routing.scorers.kv_cache import KvCacheScorer
from gateway.routing.scorers.prefix import PrefixScorer
from gateway.routing.scorers.queue import QueueScorer
from gateway.routing.scorers.speculation import SpeculationScorer
from gateway.routing.scorers.ttft import TtftScorer, prefill_rates
from gateway.settings import GatewaySettings
from gateway.usage.metrics import GatewayMetrics


@dataclass(frozen=True, slots=True)
class Decision:
    """Candidates best first, with each one's total score (for the routing span)."""

    ranked: list[WorkerView]
    scores: dict[str, float]
    filtered_out: dict[str, str]
    """Worker id → the filter that removed it."""


class Router:
    """Applies the filters, adds the weighted scores, ranks the survivors, and tells the hooks where a request
    went."""

    def __init__(
        self,
        filters: Sequence[Filter],
        scorers: Sequence[tuple[Scorer, float]],
        *,
        hooks: Sequence[PostPick] = (),
        rng: random.Random | None = None,
    ) -> None:
        self._filters = list(filters)
        self._scorers = [(s, w) for s, w in scorers if w > 0]
        self._hooks = list(hooks)
        self._rng = rng or random.Random()

    async def route(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> Decision:
        candidates = list(workers)
        removed: dict[str, str] = {}
        for f in self._filters:
            kept = await f(ctx, candidates)
            if len(kept) < len(candidates):  # a filter keeps a subset: as many is all of them
                kept_ids = {id(w) for w in kept}  # identity: comparing views field by field is slow
                removed.update({w.id: f.name for w in candidates if id(w) not in kept_ids})
            candidates = kept
        totals = [0.0] * len(candidates)
        for scorer, weight in self._scorers:
            for i, score in enumerate(await scorer(ctx, candidates)):
                totals[i] += weight * score
        ranked, scores = rank(candidates, totals, self._rng)
        return Decision(ranked=ranked, scores=scores, filtered_out=removed)

    def picked(self, ctx: RouteContext, worker: WorkerView) -> None:
        """The request of ``ctx`` went to ``worker``: run the post-pick hooks."""
        for hook in self._hooks:
            hook.picked(ctx, worker)


def default_router(
    settings: GatewaySettings,
    fleet: FleetConfig,
    tenants: TenantsConfig | None = None,
    *,
    metrics: GatewayMetrics | None = None,
    placement: Filter | None = None,
    prefix: PrefixIndex | None = None,
    rng: random.Random | None = None,
) -> Router:
    """The gateway's router, weighted by ``settings``: the placement filter from ``tenants``' tiers (or
    ``placement``; neither: routing on load alone), and prefix affinity over ``prefix`` (None, or
    ``weight_prefix`` 0: left out). A scorer whose weight is 0 is left out."""
    s = settings
    if placement is None and tenants is not None:
        placement = placement_filter(fleet, tenants, metrics=metrics)
    per_slot = s.prefill_tokens_per_slot
    scorers: list[tuple[Scorer, float]] = [
        (QueueScorer(prefill_tokens_per_slot=per_slot), s.weight_queue),
        (KvCacheScorer(), s.weight_kv),
        (SpeculationScorer(prefill_tokens_per_slot=per_slot), s.weight_speculation),
    ]
    if s.weight_ttft > 0:  # its rates come from the workers' profiles
        rates = prefill_rates(fleet, override=s.prefill_tokens_per_s)
        scorers.append((TtftScorer(rates=rates, reference_s=s.ttft_reference_s), s.weight_ttft))
    hooks: list[PostPick] = []
    if prefix is not None and s.weight_prefix > 0:
        scorers.append((PrefixScorer(prefix, load_factor=s.prefix_load_factor, prefill_tokens_per_slot=per_slot),
                        s.weight_prefix))  # fmt: skip
        hooks.append(PrefixRecorder(prefix))
    filters: list[Filter] = [
        ModelFilter(),
        *ELIGIBILITY,
        SpeculationFilter(),
        *([placement] if placement is not None else []),
    ]  # the request's speculation mode is a hard rule, so before placement chooses among what is left
    return Router(filters, scorers, hooks=hooks, rng=rng)
