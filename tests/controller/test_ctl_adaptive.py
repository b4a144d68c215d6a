"""The controller beside an engine that adapts its own verification: it reads the worker's gauge, chooses only
the cap (k_max or off), never probes at the cap and never reads the engine's short verifies as a collapse."""

from __future__ import annotations

from dataclasses import replace

from bench.policy.controller_lab import lab_controller, run_lab
from controller.adaptive import cap_decision
from controller.policy import Decision, PolicyConfig, Risk, decide
from fleet.clock import ManualClock
from fleet.perf import Profile, load_profile
from workers.sim.arrivals import Lengths, Phase, PhasedLoad, RequestKind, WorkloadMix
from workers.sim.virtual import VirtualLab, make_worker

from .ctl_helpers import make_estimate

MI355X = load_profile("kimi-k3-dspark-mi355x-tp8")


def _decision_at(observed_tok_s: float, *, accepted_length: float = 1.3) -> tuple[Decision, Decision]:
    est = make_estimate(
        MI355X, "random", k_current=7, k_max=7, batch=100.0, adaptive=True, accepted_length=accepted_length
    )
    est = replace(est, step_observed_s=100.0 * accepted_length / observed_tok_s)
    fixed = decide(est, MI355X, tpot_target_s=None, config=PolicyConfig())
    return fixed, cap_decision(est, fixed)


def test_the_cap_stays_at_k_max_while_the_engine_beats_k0() -> None:
    _, capped = _decision_at(1e6)
    assert capped.k == 7
    assert capped.gain == 0.0
    assert capped.risk is Risk.NONE


def test_the_drafter_goes_off_where_k0_beats_the_engines_best() -> None:
    fixed, capped = _decision_at(1.0)
    k0 = fixed.candidate(0)
    assert k0 is not None
    assert capped.k == 0
    assert capped.gain > 0.5


def test_short_verifies_are_not_read_as_an_acceptance_collapse() -> None:
    fixed, capped = _decision_at(1e6, accepted_length=1.05)
    assert fixed.risk is Risk.COLLAPSE
    assert fixed.k == 0
    assert capped.k == 7
    assert capped.risk is Risk.NONE


async def test_closed_loop_holds_the_cap_at_light_load_and_turns_the_drafter_off_at_heavy_load(
    lab_profile: Profile,
) -> None:
    clock = ManualClock()
    worker = make_worker(lab_profile, "w0", clock, adaptive_verification=True, seed=5)
    maths = WorkloadMix((RequestKind("maths", Lengths(200, 0.3), Lengths(300, 0.3)),))
    phases = [Phase(120, maths, concurrency=4, name="light"), Phase(120, maths, concurrency=64, name="heavy")]
    lab = VirtualLab([worker], PhasedLoad(phases), clock=clock, seed=6)
    controller = lab_controller([worker], lab_profile, clock)
    trace = await run_lab(lab, controller, until_s=240.0, tick_s=2.0)
    k_max = worker.control.k_max
    light = [k for t, k in trace.k_of("w0") if t <= 120]
    heavy = [k for t, k in trace.k_of("w0") if 200 < t <= 240]
    assert light == [k_max] * len(light), "light load: the engine adapts under the full cap, no probe, no switch"
    assert heavy == [0] * len(heavy), "64 streams on the lab profile: the drafter costs more than it brings"
    rt = controller.workers["w0"]
    assert rt.estimate is not None
    assert rt.estimate.adaptive
