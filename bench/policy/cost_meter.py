"""The controller's own cost model (``controller/cost.py``) as a meter beside every policy run.

A shadow controller (``ControllerSettings.dry_run``: it scrapes, estimates, decides and prices, never PUTs)
watches the same simulated workers as the policy under test, so every policy's cost is priced by exactly the
model operators see on the dashboards: $/Mtok per window, the drafter's and the rejected drafts' share, and the
counterfactual cost at k=0 for the same output. The meter sums the windows that end inside the measured span.
Windows in which the schedule changed are refused by the controller (one k per window), so they are not priced.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.policy.controller_lab import lab_controller
from bench.policy.policies import tenants_for
from controller.cost import WorkerCost
from controller.settings import ControllerSettings
from fleet.clock import ManualClock
from fleet.config import TierConfig
from fleet.perf import Profile
from workers.sim.virtual import TickContext, VirtualWorker


@dataclass(frozen=True, slots=True)
class ModelCost:
    """Totals of the controller's cost model over a run's measured span. USD and tokens; shares of ``usd``."""

    usd: float
    output_tokens: float
    drafter_usd: float
    rejected_usd: float
    usd_k0: float

    @property
    def usd_per_mtok(self) -> float | None:
        return self.usd / self.output_tokens * 1e6 if self.output_tokens > 0 else None

    @property
    def savings_vs_k0(self) -> float | None:
        """Share of the k=0 counterfactual cost that speculation saved (negative: it cost more)."""
        return 1.0 - self.usd / self.usd_k0 if self.usd_k0 > 0 else None


class ControllerCostMeter:
    """Ticks a dry-run controller over ``workers`` and sums its per-window ``WorkerCost`` s in ``[start, end]``."""

    def __init__(
        self,
        workers: Sequence[VirtualWorker],
        profile: Profile,
        clock: ManualClock,
        *,
        tiers: Mapping[str, TierConfig],
        tick_s: float,
        start_s: float,
        end_s: float,
    ) -> None:
        settings = ControllerSettings(tick_s=tick_s, metrics_port=0, dry_run=True)
        self._controller = lab_controller(
            workers, profile, clock, settings=settings, tenants=tenants_for(tiers), holder_id="cost-meter"
        )
        self._loop = asyncio.new_event_loop()
        self._span = (start_s, end_s)
        self._seen: dict[str, int] = {}
        self._totals = [0.0] * 5

    def on_tick(self, tick: TickContext) -> None:
        self._loop.run_until_complete(self._controller.tick())
        if not self._span[0] <= tick.now_s <= self._span[1]:
            return
        for wid, rt in self._controller.workers.items():
            cost = rt.cost
            if cost is None or self._seen.get(wid) == id(cost):
                continue  # no new window priced this tick
            self._seen[wid] = id(cost)
            self._add(cost)

    def _add(self, cost: WorkerCost) -> None:
        t = self._totals
        t[0] += cost.usd
        t[1] += cost.output_tokens
        t[2] += cost.usd * cost.drafter_share
        t[3] += cost.usd * cost.rejected_share
        t[4] += cost.usd_k0

    def result(self) -> ModelCost:
        return ModelCost(*self._totals)

    def close(self) -> None:
        self._loop.close()
