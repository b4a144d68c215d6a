"""The policies the lab compares, behind one interface.

A ``LabPolicy`` gives each worker its start-up schedule and is called at every control tick of the virtual
lab (``workers.sim.virtual.TickContext``), where it may apply a ``SpeculationUpdate`` to a worker's
``SpeculationControl`` — the same control the real-time worker exposes over HTTP (DESIGN §3.1).

- ``StaticSchedule``: a fixed schedule, never changed, on workers started with their drafter (so k = 0 pays the
  idle-drafter tax) or, for the drafter-free reference, without it. A plain ``k`` is the one-row table; vLLM's
  ``num_speculative_tokens_per_batch_size`` table and a batch-size threshold gate are multi-row tables that the
  engine applies per step by the *instantaneous* decode batch, exactly as vLLM's scheduler does.
- ``PhaseOracle``: a known k per scenario phase, switched at the phase boundaries (the hindsight oracle).
- ``ControllerPolicy``: the gearshift controller itself (``controller.loop.Controller``: estimator → policy →
  stabiliser → actuator), reading each worker's rendered ``/metrics`` and actuating its control in-process.
- ``AdaptiveVerificationPolicy``: vLLM's DSpark adaptive verification alone (``workers.sim.adaptive``): the cap
  stays at k_max and the engine chooses per step how many drafts to verify. ``ControllerPolicy`` with
  ``adaptive_verification`` is both together: the controller chooses the cap, the engine chooses per step.

``LAB_POLICIES`` names the policies that need no tuning to the scenario (the suite runs every one of them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from bench.policy.controller_lab import lab_controller
from controller.loop import Controller
from controller.settings import ControllerSettings
from fleet.clock import ManualClock
from fleet.config import TenantConfig, TenantsConfig, TierConfig
from fleet.perf import Profile, load_profile
from fleet.speculation import Schedule, SpeculationUpdate, uniform_schedule, validate_schedule
from fleet.store.protocol import WorkerState
from workers.sim.adaptive import AdaptiveVerification
from workers.sim.virtual import TickContext, VirtualWorker

ORACLE_LEASE_S = 3600.0


class LabPolicy(Protocol):
    """A speculation policy under test."""

    name: str

    def start_schedule(self, *, k_max: int, max_num_seqs: int) -> Schedule:
        """The schedule every worker starts with (its fallback when a lease runs out)."""
        ...

    def bind(self, workers: Sequence[VirtualWorker], ctx: LabContext) -> None:
        """Called once, after the workers exist and before the run starts."""
        ...

    def on_tick(self, tick: TickContext) -> None:
        """Called every ``tick_s`` of virtual time."""
        ...

    def published_states(self) -> Mapping[str, WorkerState]:
        """Worker states as the controller publishes them for the gateway's routing (empty: none)."""
        ...

    def close(self) -> None: ...


NO_STATES: Mapping[str, WorkerState] = MappingProxyType({})


@dataclass(frozen=True)
class LabContext:
    """What a policy may know about the run it is bound to."""

    profile_name: str
    tiers: Mapping[str, TierConfig]
    tick_s: float
    gpus_per_worker: int
    usd_per_gpu_hour: float
    phase_bounds: tuple[tuple[str, float, float], ...]
    """``(phase name, start_s, end_s)`` on the lab clock."""


@dataclass
class StaticSchedule:
    """A schedule fixed for the whole run: ``rows`` in vLLM's ``[[from_bs, to_bs, k], …]`` format."""

    name: str
    rows: tuple[tuple[int, int, int], ...]
    drafter: bool = True
    """The workers are started with their drafter (False: without speculation, so every row must be k = 0 and
    no k = 0 step pays the idle-drafter tax)."""

    @classmethod
    def plain(cls, k: int) -> StaticSchedule:
        return cls(f"k={k}", ((1, 1_000_000, k),))

    def start_schedule(self, *, k_max: int, max_num_seqs: int) -> Schedule:
        kept = [[a, b, min(k, k_max)] for a, b, k in self.rows if a <= max_num_seqs]
        kept[-1][1] = max_num_seqs
        return validate_schedule(kept, k_max=k_max, max_num_seqs=max_num_seqs)

    def bind(self, workers: Sequence[VirtualWorker], ctx: LabContext) -> None:
        if not self.drafter and any(k for _, _, k in self.rows):
            raise ValueError(f"{self.name}: a worker started without its drafter cannot run k > 0")
        for w in workers:
            w.engine.drafter_loaded = self.drafter

    def on_tick(self, tick: TickContext) -> None:
        return None

    def published_states(self) -> Mapping[str, WorkerState]:
        return NO_STATES

    def close(self) -> None:
        return None


@dataclass
class PhaseOracle:
    """Runs ``k_by_phase[phase]`` during each phase (the k chosen in hindsight from the static runs)."""

    name: str
    k_by_phase: Mapping[str, int]
    _bounds: tuple[tuple[str, float, float], ...] = ()
    _workers: Sequence[VirtualWorker] = ()
    _version: int = 0
    _k: int | None = None

    def _k_at(self, now_s: float) -> int:
        for name, start, end in self._bounds:
            if start <= now_s < end:
                return self.k_by_phase[name]
        return self.k_by_phase[self._bounds[-1][0]]

    def start_schedule(self, *, k_max: int, max_num_seqs: int) -> Schedule:
        first = next(iter(self.k_by_phase.values()))  # phases in scenario order
        return uniform_schedule(min(first, k_max), max_num_seqs=max_num_seqs)

    def bind(self, workers: Sequence[VirtualWorker], ctx: LabContext) -> None:
        self._bounds, self._workers = ctx.phase_bounds, workers
        self._k = self._k_at(0.0)

    def on_tick(self, tick: TickContext) -> None:
        # Decide for the next tick interval, so a switch lands on the phase boundary rather than after it.
        k = self._k_at(tick.now_s + 1e-9)
        if k != self._k:
            self._version += 1
            self._k = k
        if self._version == 0:
            return
        for w in self._workers:
            update = SpeculationUpdate(k=min(k, w.control.k_max), version=self._version, lease_seconds=ORACLE_LEASE_S)
            w.control.apply(update)

    def published_states(self) -> Mapping[str, WorkerState]:
        return NO_STATES

    def close(self) -> None:
        return None


def tenants_for(tiers: Mapping[str, TierConfig]) -> TenantsConfig:
    """One tenant per tier of the scenario, allowed every model."""
    return TenantsConfig(tiers=dict(tiers), tenants=tuple(TenantConfig(id=name, tier=name) for name in tiers))


def enable_adaptive_verification(workers: Sequence[VirtualWorker]) -> None:
    """Start every worker's engine with DSpark adaptive verification (the documented default parameters)."""
    for w in workers:
        w.engine.set_adaptive_verification(AdaptiveVerification())


@dataclass
class AdaptiveVerificationPolicy:
    """The engine alone: the cap is k_max for the whole run, each engine sizes its verification per step."""

    name: str = "adaptive"

    def start_schedule(self, *, k_max: int, max_num_seqs: int) -> Schedule:
        return uniform_schedule(k_max, max_num_seqs=max_num_seqs)

    def bind(self, workers: Sequence[VirtualWorker], ctx: LabContext) -> None:
        enable_adaptive_verification(workers)

    def on_tick(self, tick: TickContext) -> None:
        return None

    def published_states(self) -> Mapping[str, WorkerState]:
        return NO_STATES

    def close(self) -> None:
        return None


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
        self.controller = lab_controller(
            workers,
            self.believed or load_profile(ctx.profile_name),
            clock,
            settings=settings,
            tenants=tenants_for(ctx.tiers),
        )
        self._loop = asyncio.new_event_loop()

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


LAB_POLICIES: Mapping[str, Callable[[], LabPolicy]] = MappingProxyType(
    {
        "gearshift": ControllerPolicy,
        "adaptive": AdaptiveVerificationPolicy,
        "gearshift+adaptive": lambda: ControllerPolicy(name="gearshift+adaptive", adaptive_verification=True),
        "fleet-placement": lambda: _fleet_placement(),
    }
)
"""Policy name → a fresh instance, for the policies that need no tuning to the scenario: the controller alone,
adaptive verification alone, both together, and the fleet planner above the controller."""


def _fleet_placement() -> LabPolicy:
    # Imported here: bench.policy.fleet_placement builds on ControllerPolicy, defined in this module.
    from bench.policy.fleet_placement import FleetPlacementPolicy

    return FleetPlacementPolicy()
