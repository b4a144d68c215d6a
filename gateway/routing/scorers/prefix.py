"""The prefix scorer: prefer a worker that recently served this prompt's beginning, with bounded load (the index
and the blocks: ``gateway.routing.prefix``; the index learns where requests went in ``gateway.routing.hooks``)."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.context import RouteContext
from gateway.routing.pool import WorkerView, occupancy
from gateway.routing.prefix import PrefixIndex


class PrefixScorer:
    """``matched / blocks`` of the request's leading prompt blocks the index holds for the worker, or 0 when the
    worker's load exceeds ``load_factor × (least + 1)`` (bounded load; ``gateway.routing.prefix`` explains it). Requests
    without blocks score 0 everywhere."""

    name = "prefix"

    def __init__(
        self,
        index: PrefixIndex,
        *,
        load_factor: float,
        prefill_tokens_per_slot: int,
    ) -> None:
        if load_factor < 1 or prefill_tokens_per_slot <= 0:
            raise ValueError("load_factor: must be ≥ 1; prefill_tokens_per_slot: must be positive")
        self.index = index
        self._factor = load_factor
        self._per_slot = prefill_tokens_per_slot

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[float]:
        blocks = ctx.prefix_blocks
        if not blocks or not workers:
            return [0.0] * len(workers)
        matched = self.index.matches(blocks, [w.id for w in workers], ctx.now)
        loads = [occupancy(w, self._per_slot) for w in workers]
        bound = self._factor * (min(loads) + 1.0)
        return [matched[w.id] / len(blocks) if load <= bound else 0.0 for w, load in zip(workers, loads, strict=True)]
