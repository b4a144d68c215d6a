"""The controller in the virtual-time lab: simulated workers (``workers.sim.virtual``) under a load, the real
``Controller`` reading their rendered ``/metrics`` and writing their ``SpeculationControl`` directly.

The lab advances virtual time one controller tick at a time and awaits ``Controller.tick`` in between, so the
controller code under test is exactly the production code, minus HTTP. The bench reuses ``run_lab``.
The lab and its workers are described by Protocols (``workers.sim.virtual`` satisfies them), so the controller
package does not depend on the simulator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from controller.actuator import ControlActuator
from controller.gear_mode import GearModes
from controller.loop import Controller
from controller.settings import ControllerSettings
from controller.sources import MetricsSource, RenderSource, SampleSource
from fleet.clock import ManualClock
from fleet.config import DrafterConfig, FleetConfig, ModelConfig, TenantsConfig, TierConfig, WorkerConfig
from fleet.perf import Profile
from fleet.scrape import Sample
from fleet.speculation import SpeculationControl
from fleet.store.memory import MemoryStore
from fleet.store.protocol import Store


class FleetWorker(Protocol):
    """What a fleet file needs of an in-process worker: its id, model and speculation control."""

    @property
    def worker_id(self) -> str: ...
    @property
    def model_name(self) -> str: ...
    @property
    def control(self) -> SpeculationControl: ...


class VirtualWorker(FleetWorker, Protocol):
    """An in-process simulated worker (``workers.sim.virtual.VirtualWorker``)."""

    def metrics_text(self) -> bytes: ...
    def metrics_samples(self) -> Iterable[Sample]: ...


class VirtualLab(Protocol):
    """A discrete-event driver that can be advanced to a time (``workers.sim.virtual.VirtualLab``)."""

    @property
    def now_s(self) -> float: ...
    @property
    def workers(self) -> Sequence[VirtualWorker]: ...
    def run(self, until_s: float) -> object: ...


NO_TENANTS = TenantsConfig(tiers={"default": TierConfig()}, tenants=())


def lab_fleet(workers: Sequence[FleetWorker], profile: Profile) -> FleetConfig:
    """A fleet file describing in-process virtual workers (their URLs are never dialled)."""
    models = {w.model_name for w in workers}
    return FleetConfig(
        models=tuple(ModelConfig(name=m, profile=profile.name) for m in sorted(models)),
        workers=tuple(
            WorkerConfig(
                id=w.worker_id,
                url=f"http://{w.worker_id}.virtual.invalid",
                model=w.model_name,
                drafter=DrafterConfig(k_max=w.control.k_max),
                max_num_seqs=w.control.max_num_seqs,
            )
            for w in workers
        ),
    )


def lab_controller(
    workers: Sequence[VirtualWorker],
    profile: Profile,
    clock: ManualClock,
    *,
    settings: ControllerSettings | None = None,
    tenants: TenantsConfig = NO_TENANTS,
    store: Store | None = None,
    holder_id: str = "controller",
    renderers: Mapping[str, Callable[[], bytes | str]] | None = None,
    gear_modes: GearModes | None = None,
) -> Controller:
    """A ``Controller`` wired to in-process workers: ``SampleSource`` in (their metrics without the text),
    ``ControlActuator`` out. ``renderers`` (worker id → its ``/metrics`` text) reads the exposition text instead,
    for example to make one fail. ``gear_modes``: the drafter-free gear's moves (None: none)."""
    source: MetricsSource = (
        SampleSource({w.worker_id: w.metrics_samples for w in workers}, clock=clock)
        if renderers is None
        else RenderSource(renderers, clock=clock)
    )
    return Controller(
        fleet=lab_fleet(workers, profile),
        tenants=tenants,
        settings=settings or ControllerSettings(),
        source=source,
        actuator=ControlActuator({w.worker_id: w.control for w in workers}),
        store=store if store is not None else MemoryStore(clock=clock),
        clock=clock,
        profiles={profile.name: profile},
        holder_id=holder_id,
        gear_modes=gear_modes,
    )


@dataclass
class LabTrace:
    """What ``run_lab`` saw at every tick: ``(virtual time s, worker id → applied k)``."""

    ticks: list[tuple[float, dict[str, int]]] = field(default_factory=list)

    def k_of(self, worker_id: str) -> list[tuple[float, int]]:
        return [(t, ks[worker_id]) for t, ks in self.ticks]

    def switches(self, worker_id: str) -> list[float]:
        """Times at which the worker's applied k differed from the tick before."""
        ks = self.k_of(worker_id)
        return [t for (t, k), (_, prev) in zip(ks[1:], ks, strict=False) if k != prev]


async def run_lab(
    lab: VirtualLab, controller: Controller | None, *, until_s: float, tick_s: float, trace: LabTrace | None = None
) -> LabTrace:
    """Advance ``lab`` to ``until_s`` seconds of virtual time, ticking ``controller`` (None: static k) every
    ``tick_s``. Returns the per-tick applied k of every worker."""
    trace = trace or LabTrace()
    t = lab.now_s
    while t < until_s - 1e-9:
        t = min(t + tick_s, until_s)
        lab.run(t)
        if controller is not None:
            await controller.tick()
        trace.ticks.append((t, {w.worker_id: w.control.k_for(1) for w in lab.workers}))
    return trace
