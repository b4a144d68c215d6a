"""The govern stage: guards run in order, each passes the step on held or changed with its reason."""

from __future__ import annotations

from controller.canary import CanaryGate
from controller.estimator import EstimatorConfig, WorkerEstimator
from controller.runtime import WorkerRuntime
from controller.stabiliser import Action, ActionKind, initial_state
from controller.tick.govern import Canary, DrafterFreeHold, Proposal, Step, govern
from fleet.config import WorkerConfig
from fleet.perf import Profile

from .ctl_helpers import make_estimate
from .test_ctl_stabiliser import decision


class Up:
    """A guard that raises k by one, whatever it is given (to see what the later guards do with it)."""

    def govern(self, rt: WorkerRuntime, p: Proposal, step: Step) -> Step:
        k = step.action.k + 1
        return Step(initial_state(k, p.now), Action(k, ActionKind.UP, f"up to {k}"))


def _runtime(profile: Profile, worker_id: str) -> WorkerRuntime:
    config = WorkerConfig(id=worker_id, url=f"http://{worker_id}.invalid", model="kimi-k3")
    est = WorkerEstimator(worker_id, profile, 8, EstimatorConfig())
    return WorkerRuntime(config, profile, est, None, 0.0)


def _proposal(profile: Profile, *, drafter_loaded: bool = True) -> Proposal:
    before = initial_state(2, 0.0)
    return Proposal(100.0, make_estimate(profile), decision(4), before, False, drafter_loaded)


def test_guards_run_in_order_each_on_what_the_one_before_passed(lab_profile: Profile) -> None:
    rt = _runtime(lab_profile, "w1")
    step = govern([Up(), Up()], rt, _proposal(lab_profile))
    assert step.action == Action(6, ActionKind.UP, "up to 6"), "the policy's k=4, raised twice"


def test_the_canary_holds_an_unvalidated_k_off_the_canary_worker(lab_profile: Profile) -> None:
    gate = CanaryGate("w0", ticks=3)
    p = _proposal(lab_profile)
    held = govern([Up(), Canary(gate)], _runtime(lab_profile, "w1"), p)
    assert held.state == p.before
    assert (held.action.k, held.action.kind) == (2, ActionKind.HOLD)
    assert held.action.reason == "canary: k=5 not yet validated on w0"
    passed = govern([Up(), Canary(gate)], _runtime(lab_profile, "w0"), p)
    assert passed.action.k == 5, "the canary worker itself tries it"


def test_a_drafter_free_worker_is_held_at_zero_whatever_came_before(lab_profile: Profile) -> None:
    p = _proposal(lab_profile, drafter_loaded=False)
    step = govern([Up(), DrafterFreeHold()], _runtime(lab_profile, "w1"), p)
    assert (step.state.k, step.action.k, step.action.kind) == (0, 0, ActionKind.HOLD)
    assert govern([Up(), DrafterFreeHold()], _runtime(lab_profile, "w1"), _proposal(lab_profile)).action.k == 5
