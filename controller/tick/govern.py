"""Stage 3, govern: an ordered list of guards, each taking the proposed ``(state, action)`` and returning it,
held or changed, with its reason. The loop runs them in this order:

1. ``Stabilise`` — the stabiliser (``controller.stabiliser``): dwell, gain threshold, fast down, probes;
2. ``ObeyPool`` — follow the worker's pool gear in the fleet plan unless a safety path holds
   (``controller.placement.obey_pool``);
3. ``Canary`` — a k not yet validated on the canary worker is held elsewhere (``controller.canary``);
4. ``DrafterFreeHold`` — a worker started without its drafter stays at k = 0 (``controller.gear_mode``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from controller.canary import CanaryGate
from controller.estimator import Estimate
from controller.placement import FleetPlacement, obey_pool
from controller.policy import Decision
from controller.runtime import WorkerRuntime
from controller.stabiliser import Action, ActionKind, StabiliserConfig, StabiliserState, initial_state, stabilise


@dataclass(frozen=True, slots=True)
class Step:
    """What the worker is to run next: the stabiliser state it moves to and the action, with its reason."""

    state: StabiliserState
    action: Action


@dataclass(frozen=True, slots=True)
class Proposal:
    """What the guards govern: this tick's estimate and decision, against the state the tick started from."""

    now: float
    """The loop's monotonic time, seconds."""
    estimate: Estimate
    decision: Decision
    before: StabiliserState
    started: bool
    """``before`` was created this tick (the worker's first tick, or its first after a mode change)."""
    drafter_loaded: bool


class Guard(Protocol):
    def govern(self, rt: WorkerRuntime, p: Proposal, step: Step) -> Step:
        """``step`` as this guard lets it through (held or changed, with the reason in its action)."""
        ...


@dataclass(frozen=True)
class Stabilise:
    config: StabiliserConfig

    def govern(self, rt: WorkerRuntime, p: Proposal, step: Step) -> Step:
        return Step(*stabilise(step.state, p.decision, p.estimate, p.now, self.config))


@dataclass(frozen=True)
class ObeyPool:
    placement: FleetPlacement
    min_dwell_s: float

    def govern(self, rt: WorkerRuntime, p: Proposal, step: Step) -> Step:
        found = self.placement.pool_of(rt.config.id, rt.config.model)
        if found is None:
            return step
        pool = found[0]
        state, action = obey_pool(
            step.state, step.action, p.decision, p.estimate, pool, now=p.now, min_dwell_s=self.min_dwell_s,
            no_drafts=self.placement.serves_off(pool),
        )  # fmt: skip
        return Step(state, action)


@dataclass(frozen=True)
class Canary:
    gate: CanaryGate

    def govern(self, rt: WorkerRuntime, p: Proposal, step: Step) -> Step:
        gate, wid = self.gate, rt.config.id
        if rt.decision is not None:  # the canary's last window against what was predicted for it last tick
            gate.observe(wid, rt.window, rt.decision.candidate(rt.window.k) if rt.window else None)
        if p.started:
            gate.validated.add(p.before.k)  # the k a worker starts at is what it already runs
        if gate.allows(wid, step.action):
            return step
        reason = f"canary: k={step.action.k} not yet validated on {gate.canary_id}"
        return Step(p.before, Action(p.before.k, ActionKind.HOLD, reason))


class DrafterFreeHold:
    def govern(self, rt: WorkerRuntime, p: Proposal, step: Step) -> Step:
        if p.drafter_loaded:
            return step
        return Step(initial_state(0, p.now), Action(0, ActionKind.HOLD, "drafter-free: k = 0 (no drafter)"))


def govern(guards: Sequence[Guard], rt: WorkerRuntime, p: Proposal) -> Step:
    """Run the policy's wish through ``guards`` in order."""
    k = p.decision.k
    kind = ActionKind.HOLD if k == p.before.k else ActionKind.UP if k > p.before.k else ActionKind.DOWN
    step = Step(p.before, Action(k, kind, p.decision.reason))
    for guard in guards:
        step = guard.govern(rt, p, step)
    return step
