"""Post-pick hooks: told where a request went once a worker answered it."""

from __future__ import annotations

from gateway.routing.context import RouteContext
from gateway.routing.pool import WorkerView
from gateway.routing.prefix import PrefixIndex


class PrefixRecorder:
    """Records the request's prompt blocks for the worker it went to: that worker now caches them."""

    def __init__(self, index: PrefixIndex) -> None:
        self.index = index

    def picked(self, ctx: RouteContext, worker: WorkerView) -> None:
        if ctx.prefix_blocks:
            self.index.record(ctx.prefix_blocks, worker.id, ctx.now)
