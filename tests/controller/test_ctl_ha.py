"""High availability: one leader through the store's lease; a standby takes over when the leader dies."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from bench.policy.controller_lab import NO_TENANTS, lab_controller, lab_fleet, run_lab
from controller.actuator import ControlActuator
from controller.loop import Controller
from controller.settings import ControllerSettings
from fleet.clock import ManualClock, SystemClock
from fleet.config import WorkerConfig
from fleet.perf import Profile
from fleet.scrape import WorkerScrape
from fleet.speculation import SpeculationControl, uniform_schedule
from fleet.store.memory import MemoryStore
from workers.sim.arrivals import Lengths, Phase, PhasedLoad, WorkloadMix
from workers.sim.virtual import VirtualLab, make_worker

FAST = {"probe_s": 0.1, "min_dwell_s": 0.1, "probe_interval_s": 100.0}
MIX = WorkloadMix.single("maths", Lengths(200, 0.3), Lengths(300, 0.3))


async def test_standby_takes_over_a_crashed_leader_within_two_lease_periods(lab_profile: Profile) -> None:
    clock = ManualClock()
    worker = make_worker(lab_profile, "w0", clock, k=8, seed=1)
    lab = VirtualLab([worker], PhasedLoad([Phase(600, MIX, concurrency=64)]), clock=clock, seed=2)
    settings = ControllerSettings(tick_s=2.0, leader_lease_s=6.0, schedule_lease_s=30.0)
    store = MemoryStore(clock=clock)
    a = lab_controller([worker], lab_profile, clock, settings=settings, store=store, holder_id="a")
    b = lab_controller([worker], lab_profile, clock, settings=settings, store=store, holder_id="b")
    while lab.now_s < 60:  # a leads and moves the worker off its start-up k
        await run_lab(lab, None, until_s=lab.now_s + 2, tick_s=2)
        assert await a.lead_once()
        assert not await b.lead_once()
    version_by_a = worker.control.version
    assert version_by_a > 0
    assert worker.control.k_for(1) != 8
    crashed_at = lab.now_s  # a stops without releasing its lease
    took_over_at = None
    while lab.now_s < crashed_at + 30:
        await run_lab(lab, None, until_s=lab.now_s + 2, tick_s=2)
        if await b.lead_once() and took_over_at is None:
            took_over_at = lab.now_s
    assert took_over_at is not None
    assert took_over_at - crashed_at <= 2 * settings.leader_lease_s
    assert await store.lease_holder(settings.leader_lease_name) == "b"
    assert worker.control.lease_expiries == 0, "b renewed a's schedule before its lease ran out"
    assert worker.control.lease_expires_at is not None
    assert worker.control.lease_expires_at > clock.wall() + settings.schedule_lease_s / 2 - settings.tick_s
    states = await store.worker_states()
    assert states["w0"].updated_at == clock.wall()


class CountingSource:
    """A worker that keeps decoding at batch 1 with k=4 and high acceptance (a fake metrics source)."""

    def __init__(self, clock: SystemClock) -> None:
        self.clock = clock
        self.n = 0

    async def scrape(self, worker: WorkerConfig) -> WorkerScrape:
        self.n += 1
        n = float(self.n * 100)
        return WorkerScrape(
            at_s=self.clock.monotonic(), drafts=n, draft_tokens=4 * n, accepted=3 * n,
            accepted_per_pos=(0.9 * n, 0.8 * n, 0.7 * n, 0.6 * n), generation_tokens=4 * n, steps=n,
            running=1, prompt_tokens=n,
        )  # fmt: skip


async def test_cancelling_the_leader_hands_over_to_the_standby(lab_profile: Profile) -> None:
    clock = SystemClock()
    control = SpeculationControl(
        worker_id="w0", method="dspark", k_max=8, max_num_seqs=256, fallback=uniform_schedule(4, max_num_seqs=256),
        clock=clock,
    )  # fmt: skip
    fleet = lab_fleet([_Worker(control)], lab_profile)
    settings = ControllerSettings(tick_s=0.05, leader_lease_s=0.2, schedule_lease_s=5.0, stabiliser=FAST)
    store = MemoryStore(clock=clock)

    def make(holder: str) -> Controller:
        return Controller(
            fleet=fleet, tenants=NO_TENANTS, settings=settings, source=CountingSource(clock),
            actuator=ControlActuator({"w0": control}), store=store, clock=clock, holder_id=holder,
            profiles={lab_profile.name: lab_profile},
        )  # fmt: skip

    a, b = make("a"), make("b")
    stop = asyncio.Event()
    task_a = asyncio.create_task(a.run(stop))
    await _until(lambda: a.is_leader)
    task_b = asyncio.create_task(b.run(stop))
    await _until(lambda: control.version > 0)  # a applies (k=4 → k_max at batch 1)
    assert not b.is_leader
    assert _decisions(b) == 0, "a standby does not act"
    task_a.cancel()
    await asyncio.gather(task_a, return_exceptions=True)
    await _until(lambda: b.is_leader)
    await _until(lambda: _decisions(b) > 2)
    assert await store.lease_holder(settings.leader_lease_name) == "b"
    assert control.lease_expires_at is not None
    stop.set()
    await asyncio.wait_for(task_b, timeout=5)
    assert await store.lease_holder(settings.leader_lease_name) is None, "a clean stop releases the lease"


def _decisions(c: Controller) -> float:
    """Ticks in which ``c`` decided for worker w0 (any action kind)."""
    total = 0.0
    for metric in c.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "gearshift_controller_decisions_total" and sample.labels["worker"] == "w0":
                total += sample.value
    return total


class _Worker:
    def __init__(self, control: SpeculationControl) -> None:
        self.control = control
        self.worker_id = control.worker_id
        self.model_name = "kimi-k3"


async def _until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll ``cond`` every 10 ms until it holds (a loop on a real clock has no event to wait on)."""
    for _ in range(int(timeout_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"condition not met within {timeout_s} s")
