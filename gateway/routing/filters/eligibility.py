"""The draining filter (issue 14): keep workers the controller has not taken out of service for a move to or from
the drafter-free gear (``fleet.worker_mode``). A draining worker finishes the requests it has and gets no new
ones; a restarting one serves nothing. Workers with no mode record (no controller, or one that never moved
them) are kept. The records are re-read with the published states (``gateway.routing.pool.WorkerPool.refresh_shared``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gateway.routing.pool import WorkerView

if TYPE_CHECKING:  # gateway.routing.router registers this filter
    from gateway.routing.router import RouteContext


class NotDrainingFilter:
    """Keep workers whose mode record, if any, is routable (``serving`` or ``returning``)."""

    name = "not-draining"

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[WorkerView]:
        return [w for w in workers if w.mode is None or w.mode.routable]
