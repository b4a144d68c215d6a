"""The fleet plan in the virtual lab (issue 25): the real controller with its joint planner, forecast and gear moves.

``FleetPlanPolicy`` ("fleet-plan") is the controller of ``bench.policy.drafter_free_lab.DrafterFreePolicy`` (its
drafter-free gear restarts workers in lab time, the profile's ``restart_s``) with the usage
ledger fed as the gateway would feed it: every request that finished since the last tick becomes a
``UsageRecord`` (tier, workload hint, arrival, lengths, the worker that served it) in the controller's store. So
``controller.placement`` forecasts each class from the ledger (``controller.forecast``), plans pools × drafter
mode × gear × cap together (``controller.planner``), and its pools' drafter modes drive the restarts
(``controller.drafter_free``); the lab routes by the fresh plan through the gateway's own placement and draining
filters (``bench.policy.routing``). Nothing here decides: it only carries the lab's requests into the ledger.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.policy.drafter_free_lab import DrafterFreePolicy
from bench.policy.lab_policy import LabContext
from bench.policy.routing import Placement
from controller.drafter_free import DrafterFreeConfig
from fleet.store.protocol import UsageRecord
from workers.sim.records import RequestRecord
from workers.sim.virtual import TickContext, VirtualWorker


def usage_record(r: RequestRecord, *, model: str, wall_offset_s: float) -> UsageRecord:
    """The gateway's ledger record of a finished lab request (lab seconds + ``wall_offset_s`` = Unix s)."""
    return UsageRecord(
        request_id=r.request_id,
        tenant=r.tag,
        model=model,
        worker_id=r.worker_id,
        prompt_tokens=r.prompt_tokens,
        completion_tokens=r.output_tokens,
        cost_usd=0.0,
        status="ok",
        at=r.finish_s + wall_offset_s,
        arrived_at=r.arrival_s + wall_offset_s,
        tier=r.tag,
        workload=r.workload,
    )


@dataclass
class FleetPlanPolicy(DrafterFreePolicy):
    """The controller with the fleet plan driving pools, gears, caps and drafter modes (module docstring)."""

    name: str = "fleet-plan"
    config: DrafterFreeConfig = field(default_factory=lambda: DrafterFreeConfig(enabled=True))
    _last_arrival_s: float = -1.0
    """The latest arrival already looked at (``records.requests`` is in arrival order; when streamed it keeps only
    recent arrivals, so the scan goes by time, not by index)."""
    _at_last: set[str] = field(default_factory=set)
    """Ids of the requests that arrived at ``_last_arrival_s``."""
    _pending: list[RequestRecord] = field(default_factory=list)
    """Requests seen but not finished yet."""

    def bind(self, workers: Sequence[VirtualWorker], ctx: LabContext) -> None:
        super().bind(workers, ctx)
        self._last_arrival_s, self._at_last, self._pending = -1.0, set(), []

    def on_tick(self, tick: TickContext) -> None:
        self._feed_ledger(tick)
        super().on_tick(tick)

    def _feed_ledger(self, tick: TickContext) -> None:
        if self.controller is None or self._loop is None:
            return
        requests = tick.records.requests
        start = bisect.bisect_left(requests, self._last_arrival_s, key=lambda r: r.arrival_s)
        new = [r for r in requests[start:] if r.arrival_s > self._last_arrival_s or r.request_id not in self._at_last]
        if new:
            last = new[-1].arrival_s
            if last > self._last_arrival_s:
                self._at_last = set()
            self._last_arrival_s = last
            self._at_last |= {r.request_id for r in new if r.arrival_s == last}
        self._pending.extend(new)
        done = [r for r in self._pending if r.finished]
        if not done:
            return
        self._pending = [r for r in self._pending if not r.finished]
        offset = tick.clock.wall() - tick.now_s
        model = tick.workers[0].model_name
        rows = [usage_record(r, model=model, wall_offset_s=offset) for r in done]
        self._loop.run_until_complete(self.controller.store.append_usage_many(rows))

    def placement(self) -> Placement | None:
        """The controller's fresh plan for the lab's model (None: route on load)."""
        c = self.controller
        if c is None or c.placement is None:
            return None
        plans = c.placement.plans
        plan = next(iter(plans.values()), None)
        return Placement(plan) if plan is not None and plan.fresh(c.clock.wall()) else None
