"""A failed restart is not retried at once (issue 23, defect 1's sequel): a worker whose drafter-free restart
came back in its old mode, or whose restart control stopped answering, was moved again on the very next tick when
the fleet plan still wanted it drafter-free (a planned move needs no stretch, and the worker's ``mode_since`` still
dated from its first start), so it drained and restarted in a loop and, one move per model at a time, no other
planned worker of its model ever moved. The worker has just been through a restart: its minimum dwell counts from
that restart, and the model's next planned worker goes first."""

from __future__ import annotations

import pytest

from controller.drafter_free import DrafterFreeConfig
from controller.gear_mode import GearModes, GearObservation, RestartError
from fleet.clock import ManualClock
from fleet.config import FleetConfig, WorkerConfig
from fleet.restart import RestartState
from fleet.store.memory import MemoryStore
from fleet.worker_mode import Mode, Phase

RESTART_S = 10.0
TICK_S = 2.0
CONFIG = DrafterFreeConfig(enabled=True, min_dwell_s=60.0, drain_grace_s=2.0, restart_timeout_factor=2.0)
PLANNED = {"w0": False, "w1": False, "w2": True}
"""The fleet plan: w0 and w1 in its drafter-free pool, w2 with its drafter."""


class BrokenRestarts:
    """A restart control whose restarts never reach the new mode: after ``RESTART_S`` it answers in the old mode
    (``vanish`` False) or not at all (``vanish`` True)."""

    def __init__(self, clock: ManualClock, *, vanish: bool) -> None:
        self.clock = clock
        self.vanish = vanish
        self.calls: list[str] = []
        self.back_at: dict[str, float] = {}
        self.drafter = True
        """The mode it reports once it answers."""

    async def state(self, worker: WorkerConfig) -> RestartState:
        back_at = self.back_at.get(worker.id)
        if back_at is not None and self.vanish:
            raise RestartError("connection refused")
        return RestartState(drafter=self.drafter, restarting=back_at is not None and self.clock.wall() < back_at)

    async def restart(self, worker: WorkerConfig, *, drafter: bool, reason: str) -> RestartState:
        self.calls.append(worker.id)
        self.back_at[worker.id] = self.clock.wall() + RESTART_S
        return RestartState(drafter=drafter, restarting=True)


def _gears(clock: ManualClock, restarter: BrokenRestarts) -> GearModes:
    fleet = FleetConfig.model_validate({
        "models": [{"name": "m"}],
        "workers": [{"id": w, "url": f"http://{w}", "model": "m"} for w in ("w0", "w1", "w2")],
    })  # fmt: skip
    return GearModes(
        workers=fleet.workers, restart_s={w.id: RESTART_S for w in fleet.workers}, config=CONFIG,
        restarter=restarter, store=MemoryStore(clock=clock), clock=clock,
    )  # fmt: skip


async def _tick(g: GearModes, clock: ManualClock) -> None:
    """One tick 2 s after the last: every worker fresh and idle, the plan as ``PLANNED``."""
    restarting = {w for w in PLANNED if g.phase(w) is Phase.RESTARTING}
    obs = [GearObservation(w, w not in restarting, 0.0, False, False, 100.0, 1000.0) for w in PLANNED]
    await g.tick(obs, PLANNED)
    clock.advance(TICK_S)


@pytest.mark.parametrize("vanish", [False, True], ids=["falls-back", "control-vanishes"])
async def test_the_next_planned_worker_moves_after_a_failed_restart(vanish: bool) -> None:
    clock = ManualClock()
    restarter = BrokenRestarts(clock, vanish=vanish)
    g = _gears(clock, restarter)
    for _ in range(int((CONFIG.min_dwell_s + 8 * RESTART_S) / TICK_S)):
        await _tick(g, clock)
        if len(restarter.calls) > 1:
            break
    assert restarter.calls == ["w0", "w1"], "the failed worker was moved again before the model's next one"
    failed = g.modes["w0"]
    assert (failed.mode, failed.phase) == (Mode.DRAFTER, Phase.SERVING), "w0 serves as before meanwhile"
    assert clock.wall() - failed.mode_since < CONFIG.min_dwell_s, "its dwell counts from the failed restart"


async def test_a_worker_given_up_takes_the_mode_its_restart_control_reports_once_it_answers_again() -> None:
    """The restart control stopped answering after it took the restart, and the restart did take: the worker
    serves drafter-free while its record still says drafter (the controller gave up before it could know). Once the
    control answers again, the record follows what it reports, so ``off`` requests may use the worker and the plan
    no longer restarts it into the mode it is already in."""
    clock = ManualClock()
    restarter = BrokenRestarts(clock, vanish=True)
    g = _gears(clock, restarter)
    for _ in range(int((CONFIG.min_dwell_s + 8 * RESTART_S) / TICK_S)):
        await _tick(g, clock)
        if restarter.calls and g.phase("w0") is Phase.SERVING:
            break
    given_up = g.modes["w0"]
    assert (given_up.mode, given_up.phase) == (Mode.DRAFTER, Phase.SERVING), given_up
    await _tick(g, clock)
    assert g.modes["w0"].mode is Mode.DRAFTER, "nothing to go by while the control is away"
    restarter.vanish, restarter.drafter = False, False  # back, and the restart had taken
    await _tick(g, clock)
    back = g.modes["w0"]
    assert (back.mode, back.phase) == (Mode.DRAFTER_FREE, Phase.SERVING), back
    assert "reports" in back.reason
    calls = len(restarter.calls)
    for _ in range(int(2 * CONFIG.min_dwell_s / TICK_S)):
        await _tick(g, clock)
    assert restarter.calls[calls:].count("w0") == 0, "the plan's drafter-free move is done: no restart of w0"
