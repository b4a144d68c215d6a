"""The KV-cache scorer: prefer the worker with the most free KV cache."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.context import RouteContext
from gateway.routing.pool import WorkerView


class KvCacheScorer:
    """``1 − kv_usage`` (the published KV-cache fraction in use); 1 when unknown."""

    name = "kv-cache"

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[float]:
        return [1.0 - min(1.0, max(0.0, w.state.kv_usage)) if w.state else 1.0 for w in workers]
