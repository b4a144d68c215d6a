"""Defect 1 (issue 23): a failed drafter-free restart must not strand the worker. The controller's gear moves
(``controller.gear_mode``) against an in-memory restart control on a manual clock:

- the supervisor brings the old mode back (the new one did not start): the worker returns in its old mode;
- the supervisor stops answering after the restart: once ``restart_timeout_factor`` × its restart time has passed,
  the worker serves as before (routable; the gateway's health checks judge whether it is up).

Either way the other workers' moves are no longer blocked. Before the fix both stayed RESTARTING for good (still
RESTARTING after 2.8 simulated hours)."""

from __future__ import annotations

from controller.drafter_free import DrafterFreeConfig
from controller.gear_mode import GearModes, GearObservation, RestartError
from fleet.clock import ManualClock
from fleet.config import FleetConfig, WorkerConfig
from fleet.restart import RestartState
from fleet.store.memory import MemoryStore
from fleet.worker_mode import Mode, Phase

RESTART_S = 60.0
CONFIG = DrafterFreeConfig(enabled=True, dwell_factor=1.0, min_dwell_s=0.0, drain_grace_s=5.0, drain_timeout_s=100.0)
HOURS_2_8 = int(2.8 * 3600 / 2)
"""Ticks, 2 s apart, in 2.8 hours."""


class FailingRestarter:
    """A restart control whose restarts never reach the new mode: ``fallback`` — after ``RESTART_S`` it answers
    again in the old mode; else it stops answering altogether."""

    def __init__(self, clock: ManualClock, *, fallback: bool) -> None:
        self.clock = clock
        self.fallback = fallback
        self.back_at: dict[str, float] = {}
        self.calls: list[tuple[str, bool]] = []

    async def state(self, worker: WorkerConfig) -> RestartState:
        back_at = self.back_at.get(worker.id)
        if back_at is None:
            return RestartState(drafter=True, restarting=False)
        if not self.fallback:
            raise RestartError("connection refused")
        return RestartState(drafter=True, restarting=self.clock.wall() < back_at)

    async def restart(self, worker: WorkerConfig, *, drafter: bool, reason: str) -> RestartState:
        self.calls.append((worker.id, drafter))
        self.back_at[worker.id] = self.clock.wall() + RESTART_S
        return RestartState(drafter=drafter, restarting=True)


def _fleet() -> FleetConfig:
    return FleetConfig.model_validate({
        "models": [{"name": "m"}],
        "workers": [{"id": "w0", "url": "http://w0", "model": "m"}, {"id": "w1", "url": "http://w1", "model": "m"},
                    {"id": "w2", "url": "http://w2", "model": "m"}],
    })  # fmt: skip


def _gears(clock: ManualClock, restarter: FailingRestarter) -> GearModes:
    f = _fleet()
    return GearModes(
        workers=f.workers, restart_s={w.id: RESTART_S for w in f.workers}, config=CONFIG, restarter=restarter,
        store=MemoryStore(clock=clock), clock=clock,
    )  # fmt: skip


async def _run(g: GearModes, clock: ManualClock, ticks: int, *, w0_fresh: bool = True) -> None:
    """Ticks 2 s apart: k = 0 pays on w0 (so the rule moves it: its predicted gain, 200 tok/s over the 60 s
    horizon, beats the restart's cost, 60 s of its third of the load), on no other worker."""
    for _ in range(ticks):
        w0 = GearObservation("w0", w0_fresh, 0.0 if w0_fresh else None, True, False, 100.0, 1000.0, gain_tok_s=200.0)
        others = [GearObservation(w, True, 0.0, False, False, 100.0, 1000.0) for w in ("w1", "w2")]
        await g.tick([w0, *others])
        clock.advance(2.0)


async def _until_restarting(g: GearModes, clock: ManualClock) -> None:
    for _ in range(100):
        await _run(g, clock, 1)
        if g.phase("w0") is Phase.RESTARTING:
            return
    raise AssertionError(f"w0 never restarted: {g.modes.get('w0')}")


async def test_a_restart_that_falls_back_returns_the_worker_in_its_old_mode() -> None:
    clock = ManualClock()
    restarter = FailingRestarter(clock, fallback=True)
    g = _gears(clock, restarter)
    await _until_restarting(g, clock)
    assert restarter.calls == [("w0", False)]
    await _run(g, clock, HOURS_2_8, w0_fresh=False)
    mode = g.modes["w0"]
    assert mode.phase is not Phase.RESTARTING, mode
    assert mode.mode is Mode.DRAFTER, "the supervisor reports its old mode: the record says so"
    await _run(g, clock, 1)
    assert g.phase("w0") is Phase.SERVING
    assert g.drafter_loaded("w0")


async def test_a_restart_control_that_stops_answering_is_given_up_in_time() -> None:
    clock = ManualClock()
    restarter = FailingRestarter(clock, fallback=False)
    g = _gears(clock, restarter)
    await _until_restarting(g, clock)
    started = clock.wall()
    await _run(g, clock, HOURS_2_8, w0_fresh=False)
    mode = g.modes["w0"]
    assert (mode.phase, mode.mode) == (Phase.SERVING, Mode.DRAFTER), mode
    assert "not back" in mode.reason
    assert mode.since - started <= 10 * RESTART_S, "given up within a few restart times, not hours"
