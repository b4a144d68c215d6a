"""The lab's restart (``bench.policy.drafter_free_lab.VirtualRestarter``): a restarted virtual worker takes no step
for the profile's restart time, comes back without its drafter (k_max 0, no idle-drafter tax), and the lab's
gateway routing sends a draining or restarting worker nothing."""

from __future__ import annotations

import asyncio

from bench.policy.controller_lab import lab_fleet
from bench.policy.drafter_free_lab import VirtualRestarter, drafter_free_scenarios
from bench.policy.routing import GatewayRouter
from fleet.clock import ManualClock
from fleet.config import TierConfig
from fleet.perf import load_profile
from fleet.worker_mode import Mode, Phase, WorkerMode
from workers.sim.arrivals import Lengths, RequestKind, RequestSpec, WorkloadMix, closed_loop
from workers.sim.virtual import VirtualLab, make_worker

PROFILE = load_profile("kimi-k3-dspark-mi355x-tp8")


def test_a_restarted_worker_is_offline_for_restart_s_then_runs_without_its_drafter() -> None:
    clock = ManualClock()
    workers = [make_worker(PROFILE, f"w{i}", clock, max_num_seqs=16, seed=i) for i in range(2)]
    restarter = VirtualRestarter(workers, clock, restart_s=60.0)
    config = lab_fleet(workers, PROFILE).workers[0]
    asyncio.run(restarter.restart(config, drafter=False, reason="test"))
    assert asyncio.run(restarter.state(config)).restarting
    mix = WorkloadMix((RequestKind(workload="random", prompt_tokens=Lengths(64), output_tokens=Lengths(32)),))
    lab = VirtualLab(workers, closed_loop(8, mix), clock=clock, tick_s=2.0, on_tick=lambda tick: None)
    records = lab.run(59.0)
    assert not [s for s in records.steps if s.worker == 0], "no step while restarting"
    lab.run(120.0)
    steps = [s for s in records.steps if s.worker == 0]
    assert steps, "back after restart_s"
    assert min(s.start_s for s in steps) >= 60.0
    assert all(s.k == 0 and s.drafter_s == 0.0 for s in steps), "k = 0 with no idle-drafter tax"
    state = asyncio.run(restarter.state(config))
    assert (state.drafter, state.restarting, state.restarts) == (False, False, 1)
    assert workers[0].control.k_max == 0


def test_the_lab_router_sends_a_draining_or_restarting_worker_nothing() -> None:
    clock = ManualClock()
    workers = [make_worker(PROFILE, f"w{i}", clock, max_num_seqs=16) for i in range(2)]
    modes = {"w0": WorkerMode(worker_id="w0", mode=Mode.DRAFTER, phase=Phase.DRAINING, since=0, mode_since=0)}
    router = GatewayRouter(
        fleet=lab_fleet(workers, PROFILE), tiers={"batch": TierConfig()}, clock=clock, states=dict, modes=lambda: modes
    )
    spec = RequestSpec(workload="random", prompt_tokens=64, max_tokens=32, tag="batch")
    try:
        assert {router.choose(workers, spec) for _ in range(20)} == {1}
        modes.clear()
        workers[1].offline_until_s = 100.0  # restarting: unhealthy to the router
        assert {router.choose(workers, spec) for _ in range(20)} == {0}
    finally:
        router.close()


def test_the_drafter_free_scenarios_last_hours_and_outlast_the_rules_dwell() -> None:
    for scenario in drafter_free_scenarios():
        profile = load_profile(scenario.profiles[0] if scenario.profiles else scenario.profile)
        restart_s = profile.serving.restart_s
        assert restart_s is not None
        assert scenario.duration_s >= 2 * 3600
        assert max(p.duration_s for p in scenario.phases) > 10 * restart_s, "a stretch the rule can act on"
