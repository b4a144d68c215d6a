"""The policies the lab compares, behind one interface.

A ``LabPolicy`` gives each worker its start-up schedule and is called at every control tick of the virtual
lab (``workers.sim.virtual.TickContext``), where it may apply a ``SpeculationUpdate`` to a worker's
``SpeculationControl`` — the same control the real-time worker exposes over HTTP (DESIGN §3.1).

- ``StaticSchedule``: a fixed schedule, never changed, on workers started with their drafter (so k = 0 pays the
  idle-drafter tax) or, for the drafter-free reference, without it. A plain ``k`` is the one-row table; vLLM's
  ``num_speculative_tokens_per_batch_size`` table and a batch-size threshold gate are multi-row tables that the
  engine applies per step by the *instantaneous* decode batch, exactly as vLLM's scheduler does.
- ``PhaseOracle``: a known k per scenario phase, switched at the phase boundaries (the hindsight oracle).
- ``ControllerPolicy``: the gearshift controller itself (``controller.loop.Controller``: collect → decide →
  govern → push → report), reading each worker's rendered ``/metrics`` and actuating its control in-process.
- ``AdaptiveVerificationPolicy``: vLLM's DSpark adaptive verification alone (``workers.sim.adaptive``): the cap
  stays at k_max and the engine chooses per step how many drafts to verify. ``ControllerPolicy`` with
  ``adaptive_verification`` is both together: the controller chooses the cap, the engine chooses per step.

``LAB_POLICIES`` names the policies that need no tuning to the scenario (the suite runs every one of them).
The interface itself is ``bench.policy.lab_policy``; the controller's policy is ``bench.policy.controller_policy``
and the placing ones ``bench.policy.fleet_placement`` and ``bench.policy.fleet_plan_lab``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from bench.policy.controller_policy import ControllerPolicy, enable_adaptive_verification, tenants_for
from bench.policy.lab_policy import NO_STATES, LabContext, LabPolicy, Passive
from fleet.speculation import Schedule, SpeculationUpdate, uniform_schedule, validate_schedule
from fleet.worker_mode import Mode, WorkerMode
from workers.sim.virtual import TickContext, VirtualWorker

__all__ = [
    "LAB_POLICIES",
    "NO_STATES",
    "AdaptiveVerificationPolicy",
    "ControllerPolicy",
    "LabContext",
    "LabPolicy",
    "PhaseOracle",
    "StaticSchedule",
    "enable_adaptive_verification",
    "tenants_for",
]

ORACLE_LEASE_S = 3600.0


def drafter_free_modes(workers: Sequence[VirtualWorker]) -> dict[str, WorkerMode]:
    """Each worker's mode record for a run whose workers all start without their drafter and never move."""
    return {w.worker_id: WorkerMode(worker_id=w.worker_id, mode=Mode.DRAFTER_FREE, since=0.0, mode_since=0.0)
            for w in workers}  # fmt: skip


@dataclass
class StaticSchedule(Passive):
    """A schedule fixed for the whole run: ``rows`` in vLLM's ``[[from_bs, to_bs, k], …]`` format."""

    name: str
    rows: tuple[tuple[int, int, int], ...]
    drafter: bool = True
    """The workers are started with their drafter (False: without speculation, so every row must be k = 0 and
    no k = 0 step pays the idle-drafter tax)."""
    _modes: Mapping[str, WorkerMode] = field(default_factory=dict)

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
        self._modes = {} if self.drafter else drafter_free_modes(workers)

    def worker_modes(self) -> Mapping[str, WorkerMode]:
        """Started without the drafter, every worker's mode record says so (the gateway routes ``speculation:
        off`` by it); with the drafter there are no records, as in a fleet without the drafter-free gear."""
        return self._modes


@dataclass
class PhaseOracle(Passive):
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


@dataclass
class AdaptiveVerificationPolicy(Passive):
    """The engine alone: the cap is k_max for the whole run, each engine sizes its verification per step."""

    name: str = "adaptive"

    def start_schedule(self, *, k_max: int, max_num_seqs: int) -> Schedule:
        return uniform_schedule(k_max, max_num_seqs=max_num_seqs)

    def bind(self, workers: Sequence[VirtualWorker], ctx: LabContext) -> None:
        enable_adaptive_verification(workers)


LAB_POLICIES: Mapping[str, Callable[[], LabPolicy]] = MappingProxyType(
    {
        "gearshift": ControllerPolicy,
        "adaptive": AdaptiveVerificationPolicy,
        "gearshift+adaptive": lambda: ControllerPolicy(name="gearshift+adaptive", adaptive_verification=True),
    }
)
"""Policy name → a fresh instance, for the policies that need no tuning to the scenario: the controller alone,
adaptive verification alone and both together. The fleet plan (``bench.policy.fleet_plan_lab``, which needs
this module) is added by the suite."""
