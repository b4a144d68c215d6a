"""The controller's candidates are what a worker advertises at full speed (issue 14): the pure rules of
``controller.full_speed``, the policy's exclusions, and the loop against workers that advertise a restricted set
(in-process, and a simulated worker over HTTP that refuses a PUT outside it with 400)."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest

from bench.policy.controller_lab import NO_TENANTS, lab_controller, run_lab
from controller.actuator import HttpActuator
from controller.full_speed import excluded_reason, expected_batch_size, gear_schedule
from controller.loop import Controller
from controller.policy import PolicyConfig, decide
from controller.settings import ControllerSettings
from controller.sources import HttpScrapeSource
from fleet.clock import ManualClock, SystemClock
from fleet.config import DrafterConfig, FleetConfig, ModelConfig, WorkerConfig
from fleet.perf import Profile
from fleet.speculation import (
    SPECULATION_PATH,
    FullSpeed,
    check_full_speed,
    full_speed_rows,
    validate_schedule,
)
from fleet.store.memory import MemoryStore
from gearshift.cli.explain import full_speed_line
from workers.sim.arrivals import Lengths, Phase, PhasedLoad, WorkloadMix
from workers.sim.server import SimServer
from workers.sim.virtual import VirtualLab, make_worker

from .ctl_helpers import CONTROL_TOKEN, make_estimate

CFG = PolicyConfig()


def captured(k_max: int, max_num_seqs: int, ceiling: int) -> FullSpeed:
    """Every (k, n) whose decode step of n·(k+1) tokens fits a capture ceiling (the launcher's gear plan)."""
    return full_speed_rows(
        (k, n) for k in range(k_max + 1) for n in range(1, max_num_seqs + 1) if n * (k + 1) <= ceiling
    )


HOPPER = captured(7, 8, 8)
"""The K3 recipe on Hopper: --max-num-seqs 8 --max-cudagraph-capture-size 8."""


def test_the_expected_batch_is_the_rounded_mean_and_at_least_one() -> None:
    assert [expected_batch_size(b) for b in (0.0, 0.4, 1.4, 2.6)] == [1, 1, 1, 3]


def test_a_k_is_a_candidate_only_where_the_worker_advertises_it() -> None:
    assert [k for k in range(8) if not excluded_reason(k, HOPPER, 3.2)] == [0, 1]  # 3·2 ≤ 8 < 3·3
    assert [k for k in range(8) if not excluded_reason(k, HOPPER, 1.0)] == list(range(8))
    assert excluded_reason(3, HOPPER, 3.0) == "k=3 not at full speed at batch 3 (advertised for batch sizes 1-2)"
    assert all(not excluded_reason(k, None, 3.0) for k in range(8)), "null: every k"
    narrow = captured(7, 32, 8)  # nothing captured above 8 sequences
    assert all(not excluded_reason(k, narrow, 20.0) for k in range(8)), "a batch in no row: every k"


@pytest.mark.parametrize("k", range(8))
def test_every_gear_schedule_keeps_to_the_advertised_pairs(k: int) -> None:
    schedule = gear_schedule(k, HOPPER, max_num_seqs=8)
    check_full_speed(schedule, HOPPER)
    assert validate_schedule(schedule, k_max=7, max_num_seqs=8) == schedule
    assert schedule[0] == (1, 8 // (k + 1), k), "k where it is captured, from batch size 1"
    assert max(row[2] for row in schedule) == k


def test_a_gear_schedule_falls_to_the_nearest_lower_gear_and_keeps_k_where_nothing_is_captured() -> None:
    assert gear_schedule(1, HOPPER, max_num_seqs=8) == ((1, 4, 1), (5, 8, 0))
    assert gear_schedule(3, HOPPER, max_num_seqs=8) == ((1, 2, 3), (3, 4, 1), (5, 8, 0))
    narrow = captured(7, 16, 8)
    assert gear_schedule(1, narrow, max_num_seqs=16) == ((1, 4, 1), (5, 8, 0), (9, 16, 1))


def test_the_policy_chooses_among_advertised_gears_and_says_which_it_excluded(lab_profile: Profile) -> None:
    est = make_estimate(lab_profile, batch=3.0)
    free = decide(est, lab_profile, tpot_target_s=None, config=CFG)
    assert free.k >= 2, "unrestricted, a long draft wins at batch 3 on maths"
    fs = captured(8, 8, 8)
    restricted = decide(est, lab_profile, tpot_target_s=None, config=CFG, full_speed=fs)
    assert restricted.k in (0, 1)
    excluded = [c.k for c in restricted.candidates if not c.full_speed]
    assert excluded == [2, 3, 4, 5, 6, 7], "every advertised gear is a candidate; k=8 has no graph anywhere"
    assert all(c.step_s > 0 for c in restricted.candidates), "excluded k are still predicted"
    assert "not at full speed at this batch: k=2, 3, 4, 5, 6, 7" in restricted.reason


def test_a_safety_cap_wins_over_the_advertised_set(lab_profile: Profile) -> None:
    est = make_estimate(lab_profile, batch=1.0, accepted_length=1.0)  # acceptance collapsed: k must be 0
    only_k_max = full_speed_rows([(8, 1)])
    d = decide(est, lab_profile, tpot_target_s=None, config=CFG, full_speed=only_k_max)
    assert d.k == 0


def lab_with(profile: Profile, full_speed: FullSpeed, concurrency: int) -> tuple[ManualClock, VirtualLab]:
    clock = ManualClock()
    workers = [make_worker(profile, "w0", clock, k=8, max_num_seqs=8, seed=1)]
    workers[0].control.full_speed = full_speed
    mix = WorkloadMix.single("maths", Lengths(200, 0.3), Lengths(300, 0.3))
    return clock, VirtualLab(workers, PhasedLoad([Phase(1000, mix, concurrency=concurrency)]), clock=clock)


async def test_the_loop_never_draws_a_refusal_from_a_worker_that_restricts_its_gears(lab_profile: Profile) -> None:
    clock, vlab = lab_with(lab_profile, HOPPER, concurrency=6)
    worker = vlab.workers[0]
    ctl = lab_controller(vlab.workers, lab_profile, clock)
    await run_lab(vlab, ctl, until_s=120, tick_s=2)
    rt = ctl.workers["w0"]
    assert rt.full_speed == HOPPER, "read from the worker's GET"
    failures = ctl.metrics.registry.get_sample_value("gearshift_controller_actuation_failures_total", {"worker": "w0"})
    assert not failures, "every PUT kept to the advertised set"
    assert worker.control.version > 0, "the controller did shift the worker"
    assert rt.stab is not None
    assert worker.control.schedule == gear_schedule(rt.stab.k, HOPPER, max_num_seqs=8)
    assert rt.estimate is not None
    assert not excluded_reason(rt.stab.k, HOPPER, rt.estimate.batch), "the gear is at full speed at the batch"
    assert "excluded at batch" in full_speed_line(rt).plain


async def test_a_restarted_worker_is_asked_for_its_full_speed_set_again(lab_profile: Profile) -> None:
    clock, vlab = lab_with(lab_profile, HOPPER, concurrency=2)
    worker = vlab.workers[0]
    fresh = make_worker(lab_profile, "w0", clock, k=8, max_num_seqs=8, seed=2)
    serving = {"metrics": worker.metrics_text}
    ctl = lab_controller(vlab.workers, lab_profile, clock, renderers={"w0": lambda: serving["metrics"]()})
    await run_lab(vlab, ctl, until_s=20, tick_s=2)
    assert ctl.workers["w0"].full_speed == HOPPER
    wider = captured(7, 8, 64)
    worker.control.full_speed = wider  # what the worker advertises once restarted
    serving["metrics"] = fresh.metrics_text  # its counters start again from zero
    await run_lab(vlab, ctl, until_s=24, tick_s=2)
    assert ctl.workers["w0"].full_speed == wider


async def test_a_simulated_worker_over_http_accepts_the_gear_schedule_and_refuses_a_plain_k(
    sim_server: SimServer, lab_profile: Profile
) -> None:
    full_speed = captured(8, 256, 16)  # k=1 at full speed for 1-8 sequences only; k=0 for 1-16
    sim_server.worker.control.full_speed = full_speed
    fleet = FleetConfig(
        models=(ModelConfig(name="kimi-k3", profile=lab_profile.name),),
        workers=(WorkerConfig(id="rt-0", url=sim_server.url, model="kimi-k3", drafter=DrafterConfig(k_max=8)),),
    )
    settings = ControllerSettings(control_token=CONTROL_TOKEN)
    clock = SystemClock()
    async with httpx.AsyncClient() as client:
        ctl = Controller(
            fleet=fleet, tenants=NO_TENANTS, settings=settings, source=HttpScrapeSource(client, clock=clock),
            actuator=HttpActuator(client, control_token=CONTROL_TOKEN), store=MemoryStore(clock=clock),
            clock=clock, profiles={lab_profile.name: lab_profile},
        )  # fmt: skip
        rt = ctl.workers["rt-0"]
        await ctl.tick()
        assert rt.full_speed == full_speed
        assert rt.stab is not None
        rt.stab = replace(rt.stab, k=1)  # as if the stabiliser had chosen k = 1
        await ctl.tick()
        state = (await client.get(sim_server.url + SPECULATION_PATH)).json()
        plain = {"k": 1, "version": state["version"] + 1}
        refused = await client.put(
            sim_server.url + SPECULATION_PATH, json=plain, headers={"Authorization": f"Bearer {CONTROL_TOKEN}"}
        )
    assert state["schedule"] == [[1, 8, 1], [9, 16, 0], [17, 256, 1]]
    failures = ctl.metrics.registry.get_sample_value(
        "gearshift_controller_actuation_failures_total", {"worker": "rt-0"}
    )
    assert not failures
    assert refused.status_code == 400
    assert "full-speed set" in refused.text
