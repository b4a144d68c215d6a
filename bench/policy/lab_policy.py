"""The interface every policy under test in the lab implements (``LabPolicy``), what it may know of its run
(``LabContext``), and the hooks of a policy that does nothing during the run, defined once (``Passive``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from fleet.config import TierConfig
from fleet.speculation import Schedule
from fleet.store.protocol import WorkerState
from workers.sim.virtual import TickContext, VirtualWorker


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


class Passive:
    """The ``LabPolicy`` hooks of a policy that neither acts during the run, nor publishes worker states, nor
    holds anything to close (a subclass overrides the ones it needs)."""

    def on_tick(self, tick: TickContext) -> None:
        return None

    def published_states(self) -> Mapping[str, WorkerState]:
        return NO_STATES

    def close(self) -> None:
        return None
