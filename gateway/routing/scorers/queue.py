"""The queue scorer: prefer the worker with the least work."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.context import RouteContext
from gateway.routing.pool import WorkerView, occupancy


class QueueScorer:
    """``max_num_seqs / (max_num_seqs + occupancy)`` with ``occupancy = load + prefill_tokens /
    prefill_tokens_per_slot`` (``gateway.routing.pool.occupancy``; ``load = max(running + waiting, own
    in-flight)``, requests; ``prefill_tokens`` the estimated prompt tokens of this gateway's requests on the worker
    not yet answered with a first byte): 1 when idle, ½ at one batch of work, and never flat. It must not
    saturate: within a burst the gateway's own counts are the only signal that moves (published state is a tick
    old), and a clipped score (0 for every worker past a full batch, e.g. four 8 k-token prompts on a 32-sequence
    worker) would leave the burst's placement to the stale signals."""

    name = "queue"

    def __init__(self, *, prefill_tokens_per_slot: int) -> None:
        if prefill_tokens_per_slot <= 0:
            raise ValueError(f"prefill_tokens_per_slot: must be positive, got {prefill_tokens_per_slot}")
        self._per_slot = prefill_tokens_per_slot

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[float]:
        per_slot = self._per_slot
        return [w.config.max_num_seqs / (w.config.max_num_seqs + occupancy(w, per_slot)) for w in workers]
