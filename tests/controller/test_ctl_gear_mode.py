"""The drafter-free gear's moves (``controller.gear_mode``) against an in-memory restart control: each phase in
turn, a drain that does not empty, a refused restart, a worker with no restart control, the operator's vetoes;
and the gateway's draining filter."""

from __future__ import annotations

from controller.drafter_free import DrafterFreeConfig
from controller.gear_mode import GearModes, GearObservation, RestartError
from controller.metrics import ControllerMetrics
from fleet.clock import ManualClock
from fleet.config import FleetConfig, TierConfig, WorkerConfig
from fleet.restart import RestartState
from fleet.store.memory import MemoryStore
from fleet.worker_mode import Mode, Phase, WorkerMode, read_modes
from gateway.routing.context import RouteContext
from gateway.routing.filters.eligibility import NotDrainingFilter
from gateway.routing.pool import WorkerView

RESTART_S = 60.0
CONFIG = DrafterFreeConfig(enabled=True, dwell_factor=1.0, min_dwell_s=0.0, drain_grace_s=5.0, drain_timeout_s=100.0)


class FakeRestarter:
    """Restarts take ``restart_s`` of the clock; ``refuse`` makes the next restart fail; ``absent`` ids have no
    restart control."""

    def __init__(self, clock: ManualClock, *, absent: frozenset[str] = frozenset()) -> None:
        self.clock = clock
        self.absent = absent
        self.refuse = False
        self.drafter: dict[str, bool] = {}
        self.back_at: dict[str, float] = {}
        self.calls: list[tuple[str, bool]] = []

    async def state(self, worker: WorkerConfig) -> RestartState:
        if worker.id in self.absent:
            raise RestartError("no restart control")
        back = self.back_at.get(worker.id, 0.0) <= self.clock.wall()
        return RestartState(drafter=self.drafter.get(worker.id, True), restarting=not back)

    async def restart(self, worker: WorkerConfig, *, drafter: bool, reason: str) -> RestartState:
        if self.refuse:
            raise RestartError("HTTP 409")
        self.calls.append((worker.id, drafter))
        self.drafter[worker.id] = drafter
        self.back_at[worker.id] = self.clock.wall() + RESTART_S
        return RestartState(drafter=drafter, restarting=True)


def fleet(*, veto_w1: bool = False) -> FleetConfig:
    return FleetConfig.model_validate({
        "models": [{"name": "m"}],
        "workers": [{"id": "w0", "url": "http://w0", "model": "m"},
                    {"id": "w1", "url": "http://w1", "model": "m", "allow_drafter_free": not veto_w1}],
    })  # fmt: skip


def obs(wid: str, *, in_flight: float = 0.0, off_pays: bool = True, fresh: bool = True) -> GearObservation:
    return GearObservation(wid, fresh, in_flight if fresh else None, off_pays, False, 100.0, 1000.0, gain_tok_s=200.0)


def gears(
    clock: ManualClock, restarter: FakeRestarter, f: FleetConfig, config: DrafterFreeConfig = CONFIG
) -> GearModes:
    return GearModes(
        workers=f.workers, restart_s={w.id: RESTART_S for w in f.workers}, config=config, restarter=restarter,
        store=MemoryStore(clock=clock), clock=clock,
    )  # fmt: skip


async def run(g: GearModes, clock: ManualClock, ticks: int, *, in_flight: float = 0.0, fresh: bool = True) -> None:
    """``ticks`` ticks 2 s apart: w0 with ``in_flight`` sequences (``fresh`` metrics), w1 where off does not pay."""
    for _ in range(ticks):
        await g.tick([obs("w0", in_flight=in_flight, fresh=fresh), obs("w1", off_pays=False)])
        clock.advance(2.0)


async def test_each_phase_in_turn_and_the_records_in_the_store() -> None:
    clock = ManualClock()
    restarter = FakeRestarter(clock)
    g = gears(clock, restarter, fleet())
    await run(g, clock, 1)
    assert g.phase("w0") is Phase.SERVING
    assert g.drafter_loaded("w0")
    await run(g, clock, 31)  # k = 0 pays for 62 s ≥ 1 × restart_s
    assert g.phase("w0") is Phase.DRAINING
    await run(g, clock, 1, in_flight=3.0)
    assert g.phase("w0") is Phase.DRAINING, "still busy"
    await run(g, clock, 3)  # drained, past the grace
    assert g.phase("w0") is Phase.RESTARTING
    assert restarter.calls == [("w0", False)]
    await run(g, clock, 31, fresh=False)  # 62 s of a worker that is down
    assert g.phase("w0") is Phase.RETURNING
    assert not g.drafter_loaded("w0")
    await run(g, clock, 1)
    stored = (await read_modes(g.store))["w0"]
    assert (stored.mode, stored.phase) == (Mode.DRAFTER_FREE, Phase.SERVING)
    assert g.phase("w1") is Phase.SERVING
    assert g.drafter_loaded("w1")
    metrics = ControllerMetrics()
    g.export(metrics)
    value = metrics.registry.get_sample_value(
        "gearshift_controller_worker_mode", {"worker": "w0", "mode": "drafter-free", "phase": "serving"}
    )
    assert value == 1.0


async def test_a_drain_that_does_not_empty_or_a_refused_restart_serves_as_before() -> None:
    clock = ManualClock()
    restarter = FakeRestarter(clock)
    g = gears(clock, restarter, fleet())
    await run(g, clock, 32)
    assert g.phase("w0") is Phase.DRAINING
    await run(g, clock, 52, in_flight=1.0)  # 104 s > drain_timeout_s
    mode = g.modes["w0"]
    assert (mode.phase, mode.mode) == (Phase.SERVING, Mode.DRAFTER)
    assert "drain given up" in mode.reason
    restarter.refuse = True
    clock.advance(1000.0)
    await run(g, clock, 5)
    assert g.modes["w0"].phase is Phase.SERVING
    assert "restart refused" in g.modes["w0"].reason
    assert restarter.calls == []


async def test_no_restart_control_or_the_operators_switch_keeps_a_worker_as_started() -> None:
    clock = ManualClock()
    g = gears(clock, FakeRestarter(clock, absent=frozenset({"w0"})), fleet())
    await run(g, clock, 40)
    assert "w0" not in g.modes
    assert g.drafter_loaded("w0")
    vetoed = gears(clock, FakeRestarter(clock), fleet(veto_w1=True))
    for _ in range(40):
        await vetoed.tick([obs("w0", off_pays=False), obs("w1")])
        clock.advance(2.0)
    assert vetoed.phase("w1") is Phase.SERVING
    assert "forbidden for this worker" in vetoed.verdicts["w1"].reason
    off = gears(clock, FakeRestarter(clock), fleet(), config=CONFIG.model_copy(update={"enabled": False}))
    await run(off, clock, 40)
    assert "forbidden fleet-wide" in off.verdicts["w0"].reason


async def test_the_draining_filter_keeps_serving_and_returning_workers() -> None:
    f = fleet()
    views = [WorkerView(config=w) for w in f.workers] + [WorkerView(config=f.workers[0])]
    views[0].mode = WorkerMode(worker_id="w0", mode=Mode.DRAFTER, phase=Phase.DRAINING, since=1, mode_since=1)
    views[1].mode = WorkerMode(worker_id="w1", mode=Mode.DRAFTER_FREE, phase=Phase.RETURNING, since=1, mode_since=1)
    ctx = RouteContext(model="m", tier=TierConfig(), now=0.0)
    kept = await NotDrainingFilter()(ctx, views)
    assert kept == views[1:]
    views[1].mode = views[1].mode.model_copy(update={"phase": Phase.RESTARTING})
    assert await NotDrainingFilter()(ctx, views) == views[2:]


async def test_a_worker_with_no_restart_time_is_never_moved_but_still_carries_the_others_load() -> None:
    clock = ManualClock()
    restarter = FakeRestarter(clock)
    f = fleet()
    g = GearModes(
        workers=f.workers, restart_s={"w0": RESTART_S}, config=CONFIG, restarter=restarter,
        store=MemoryStore(clock=clock), clock=clock,
    )  # fmt: skip
    for _ in range(40):
        await g.tick([obs("w0"), obs("w1")])
        clock.advance(2.0)
    assert restarter.calls == [("w0", False)], "w1 is w0's peer, never a mover"
    assert "forbidden for this worker" in g.verdicts["w1"].reason
