"""The drafter-free gear in the virtual lab (issue 14): the real controller with its gear moves
(``controller.gear_mode`` over ``controller.drafter_free``'s rule) against the same controller without them.

Workers start with their drafter, so k = 0 on them pays the profile's idle-drafter tax (``fleet.perf``). A move
drains a worker through the gateway's own draining filter (the lab routes with ``gateway.routing``), then
restarts it: the worker takes no step for the profile's ``serving.restart_s`` of virtual time and comes back
with a fresh speculation control (k_max 0 without the drafter), as a restarted vLLM would. The scenarios
(``bench/policy/drafter_free_scenarios/``) last hours of virtual time, with long stretches where k = 0 is best.

``gearshift bench drafter-free`` runs both policies on every such scenario and writes
``docs/benchmarks/drafter-free.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.policy.lab import run_policy
from bench.policy.policies import ControllerPolicy, LabContext
from bench.policy.run_metrics import RunMetrics, summarise
from bench.policy.scenario import Scenario, load_scenarios
from controller.drafter_free import DrafterFreeConfig
from controller.gear_mode import GearModes
from fleet.clock import ManualClock
from fleet.config import WorkerConfig
from fleet.perf import load_profile
from fleet.restart import RestartState
from fleet.speculation import SpeculationControl, uniform_schedule
from fleet.worker_mode import WorkerMode
from workers.sim.virtual import TickContext, VirtualWorker

SCENARIO_DIR = Path(__file__).with_name("drafter_free_scenarios")


def drafter_free_scenarios(names: Sequence[str] | None = None) -> list[Scenario]:
    return load_scenarios(SCENARIO_DIR, list(names) if names else None)


class VirtualRestarter:
    """``controller.gear_mode.Restarter`` on in-process workers: a restart takes ``restart_s`` of lab time."""

    def __init__(self, workers: Sequence[VirtualWorker], clock: ManualClock, *, restart_s: float) -> None:
        self._workers = {w.worker_id: w for w in workers}
        self._clock = clock
        self._restart_s = restart_s
        self.restarts: dict[str, int] = dict.fromkeys(self._workers, 0)

    async def state(self, worker: WorkerConfig) -> RestartState:
        w = self._workers[worker.id]
        back = w.offline_until_s <= self._clock.monotonic()
        return RestartState(
            drafter=w.engine.drafter_loaded,
            restarting=not back,
            restarts=self.restarts[worker.id],
            restart_s=self._restart_s,
        )

    async def restart(self, worker: WorkerConfig, *, drafter: bool, reason: str) -> RestartState:
        w = self._workers[worker.id]
        old = w.control
        k_max = w.engine.profile.drafter.k_max if drafter else 0
        w.engine.control = SpeculationControl(
            worker_id=old.worker_id,
            method=old.method,
            k_max=k_max,
            max_num_seqs=old.max_num_seqs,
            fallback=uniform_schedule(k_max, max_num_seqs=old.max_num_seqs),
            clock=old.clock,
            full_speed=None if drafter else ((0, 1, old.max_num_seqs),),
        )
        w.engine.drafter_loaded = drafter
        w.__dict__.pop("_metrics", None)  # its /metrics renders the new control (a cached_property)
        w.offline_until_s = self._clock.monotonic() + self._restart_s
        self.restarts[worker.id] += 1
        return RestartState(drafter=drafter, restarting=True, restarts=self.restarts[worker.id] - 1)


@dataclass
class DrafterFreePolicy(ControllerPolicy):
    """The controller with the drafter-free gear: its moves drain, restart and return workers in lab time."""

    name: str = "gearshift+drafter-free"
    config: DrafterFreeConfig = field(default_factory=lambda: DrafterFreeConfig(enabled=True))
    gears: GearModes | None = None
    restarter: VirtualRestarter | None = None
    drafter_free_s: float = 0.0
    """Worker-seconds of lab time spent started without the drafter (restarting into it included)."""
    _tick_s: float = 0.0

    def bind(self, workers: Sequence[VirtualWorker], ctx: LabContext) -> None:
        super().bind(workers, ctx)
        assert self.controller is not None  # ControllerPolicy.bind built it
        restart_s = load_profile(ctx.profile_name).serving.restart_s
        if restart_s is None:
            raise ValueError(f"{ctx.profile_name}: the profile models no serving.restart_s")
        clock = workers[0].control.clock
        assert isinstance(clock, ManualClock)  # ControllerPolicy.bind checked it
        self.restarter = VirtualRestarter(workers, clock, restart_s=restart_s)
        fleet = [rt.config for rt in self.controller.workers.values()]
        self.gears = GearModes(
            workers=fleet,
            restart_s={w.id: restart_s for w in fleet},
            config=self.config,
            restarter=self.restarter,
            store=self.controller.store,
            clock=clock,
        )
        self.controller.gear_modes = self.gears
        self._tick_s = ctx.tick_s

    def on_tick(self, tick: TickContext) -> None:
        super().on_tick(tick)
        self.drafter_free_s += self._tick_s * sum(1 for w in tick.workers if not w.engine.drafter_loaded)

    def worker_modes(self) -> Mapping[str, WorkerMode]:
        return self.gears.modes if self.gears is not None else {}


@dataclass(frozen=True)
class Comparison:
    """Both policies on one scenario."""

    scenario: Scenario
    without: RunMetrics
    with_gear: RunMetrics
    restarts: int
    drafter_free_s: float
    """Worker-seconds spent serving drafter-free (virtual seconds, all workers)."""


def compare(scenario: Scenario) -> Comparison:
    """Run the controller without and with the drafter-free gear on ``scenario`` (bound to its profile)."""
    profile = load_profile(scenario.profile)
    without = summarise(run_policy(scenario, ControllerPolicy(), profile=profile), profile)
    gear = DrafterFreePolicy()
    raw = run_policy(scenario, gear, profile=profile)
    with_gear = summarise(raw, profile)
    restarts = sum(gear.restarter.restarts.values()) if gear.restarter is not None else 0
    return Comparison(scenario, without, with_gear, restarts, gear.drafter_free_s)
