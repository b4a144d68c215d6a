"""The gearshift controller as a lab policy (``ControllerPolicy``): the production ``controller.loop.Controller``
ticking in virtual time, reading each worker's metrics and actuating its control in-process
(``bench.policy.controller_lab``)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bench.policy.controller_lab import lab_controller
from bench.policy.lab_policy import LabContext
from controller.loop import Controller
from controller.settings import ControllerSettings
from fleet.clock import ManualClock
from fleet.config import TenantConfig, TenantsConfig, TierConfig
from fleet.perf import Profile, load_profile
from fleet.speculation import Schedule, uniform_schedule
from fleet.store.protocol import WorkerState
from workers.sim.adaptive import AdaptiveVerification
from workers.sim.virtual import TickContext, VirtualWorker


def tenants_for(tiers: Mapping[str, TierConfig]) -> TenantsConfig:
    """One tenant per tier of the scenario, allowed every model."""
    return TenantsConfig(tiers=dict(tiers), tenants=tuple(TenantConfig(id=name, tier=name) for name in tiers))


def enable_adaptive_verification(workers: Sequence[VirtualWorker]) -> None:
    """Start every worker's engine with DSpark adaptive verification (the documented default parameters)."""
    for w in workers:
        w.engine.set_adaptive_verification(AdaptiveVerification())


@dataclass
class ControllerPolicy:
    """The gearshift controller, ticking in virtual time. Workers start at k_max, like a fresh vLLM worker.
    With ``adaptive_verification`` their engines adapt too, and the controller (which sees it in their metrics)
    chooses the cap."""

    name: str = "gearshift"
    settings_overrides: Mapping[str, object] = field(default_factory=dict)
    adaptive_verification: bool = False
    believed: Profile | None = None
    """The profile the controller's model holds (None: the scenario's, which the workers run too); set it to
    another to run the controller with a wrong model (``bench.policy.robustness``)."""
    controller: Controller | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _states: Mapping[str, WorkerState] = field(default_factory=dict)

    def start_schedule(self, *, k_max: int, max_num_seqs: int) -> Schedule:
        return uniform_schedule(k_max, max_num_seqs=max_num_seqs)

    def bind(self, workers: Sequence[VirtualWorker], ctx: LabContext) -> None:
        clock = workers[0].control.clock
        if not isinstance(clock, ManualClock):
            raise TypeError("ControllerPolicy: the virtual lab's workers must run on a ManualClock")
        if self.adaptive_verification:
            enable_adaptive_verification(workers)
        settings = ControllerSettings(
            tick_s=ctx.tick_s,
            metrics_port=0,
            **dict(self.settings_overrides),  # type: ignore[arg-type]
        )
        self.controller = self.build(workers, ctx, clock, settings)
        self._loop = asyncio.new_event_loop()

    def build(
        self, workers: Sequence[VirtualWorker], ctx: LabContext, clock: ManualClock, settings: ControllerSettings
    ) -> Controller:
        """The controller for ``workers`` (a subclass adds what it needs, e.g. gear modes)."""
        profile = self.believed or load_profile(ctx.profile_name)
        return lab_controller(workers, profile, clock, settings=settings, tenants=tenants_for(ctx.tiers))

    def on_tick(self, tick: TickContext) -> None:
        if self._loop is None or self.controller is None:
            raise RuntimeError("ControllerPolicy.on_tick: bind() must be called first")
        self._loop.run_until_complete(self.controller.tick())
        c = self.controller
        self._states = {
            wid: c.worker_state(rt)
            for wid, rt in c.workers.items()
            if rt.estimate is not None and not rt.estimate.stale
        }

    def published_states(self) -> Mapping[str, WorkerState]:
        return self._states

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None
