"""The speculation scorer: fit a worker's published gear to the tier's speculation preference."""

from __future__ import annotations

from collections.abc import Sequence

from fleet.config import SpeculationPreference, TierConfig
from gateway.routing.context import RouteContext
from gateway.routing.pool import WorkerView, occupancy

NEUTRAL_SCORE = 0.5


class SpeculationScorer:
    """Fit of a worker's published speculation state to the tier's preference. For a tier with a preference,
    overloaded workers score 0; workers without published state score 0.5 (no opinion).

    - ``speed`` (interactive): relative per-user speed ``s / max(s)`` over the candidates, with
      ``s = 1 / tpot_predicted_s`` (or the accepted length when no TPOT is predicted), times
      ``target / tpot_predicted`` when the prediction misses the tier's TPOT target, times
      ``(1 + published) / (1 + max(published, now))``: the prediction was made at the published load
      (running + waiting, requests) and a worker's per-user speed falls about in proportion to the load added
      since (``now``: ``gateway.routing.pool.occupancy``, as the queue scorer counts it). Without it a burst
      that arrives within one tick all goes to the worker that was fastest before it.
    - ``throughput`` (batch): the cheapest published cost scores 1, others ``min_cost / usd_per_mtok``;
      without published costs ``1 − k_applied / k_max`` — bulk work goes to workers already in a low gear,
      where extra batch costs little, and stays off the fast lanes whose high k it would knock down.
    - ``neutral``: 0.5 for every worker, overloaded or not: a tier without a preference is placed by load alone.
      The published ``overloaded`` flag is a tick old and binary; at this scorer's weight it would send a whole
      burst that arrives within one tick to the workers not flagged (the load scorers see the burst as it lands).
    """

    name = "speculation"

    def __init__(self, *, prefill_tokens_per_slot: int) -> None:
        if prefill_tokens_per_slot <= 0:
            raise ValueError(f"prefill_tokens_per_slot: must be positive, got {prefill_tokens_per_slot}")
        self._per_slot = prefill_tokens_per_slot

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[float]:
        pref = ctx.tier.prefer
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
            now = occupancy(w, self._per_slot)
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
