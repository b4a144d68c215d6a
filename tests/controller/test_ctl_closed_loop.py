"""Closed loop in virtual time: the real Controller against simulated workers (workers.sim.virtual)."""

from __future__ import annotations

from collections.abc import Sequence

from bench.policy.controller_lab import LabTrace, lab_controller, run_lab
from fleet.clock import ManualClock
from fleet.perf import Profile
from workers.sim.arrivals import Lengths, Phase, PhasedLoad, WorkloadMix
from workers.sim.virtual import VirtualLab, make_worker

TICK_S = 2.0


def mix(workload: str) -> WorkloadMix:
    return WorkloadMix.single(workload, Lengths(200, 0.3), Lengths(300, 0.3))


async def run_phases(profile: Profile, phases: Sequence[Phase], *, seed: int = 1) -> LabTrace:
    clock = ManualClock()
    worker = make_worker(profile, "w0", clock, k=8, seed=seed)
    lab = VirtualLab([worker], PhasedLoad(phases), clock=clock, seed=seed + 1)
    controller = lab_controller([worker], profile, clock)
    return await run_lab(lab, controller, until_s=sum(p.duration_s for p in phases), tick_s=TICK_S)


def settled_k(trace: LabTrace, end_s: float, span_s: float = 10.0) -> list[int]:
    """The applied k over the last ``span_s`` seconds before ``end_s``."""
    return [k for t, k in trace.k_of("w0") if end_s - span_s < t <= end_s]


def max_switches_per_minute(trace: LabTrace) -> int:
    times = trace.switches("w0")
    return max((sum(1 for u in times if t <= u < t + 60) for t in times), default=0)


async def test_load_ramp_up_turns_speculation_off_and_back(lab_profile: Profile) -> None:
    phases = [
        Phase(40, mix("maths"), concurrency=1),
        Phase(80, mix("maths"), concurrency=64),
        Phase(80, mix("maths"), concurrency=1),
    ]
    trace = await run_phases(lab_profile, phases)
    assert min(settled_k(trace, 40)) >= 6, "low load: a high k"
    heavy = settled_k(trace, 120)
    assert heavy[-1] == 0, "64 streams: speculation stops paying in the lab profile"
    assert set(heavy) <= {0, 1}, "at most a bounded probe of the neighbouring gear (issue 25)"
    assert min(settled_k(trace, 200)) >= 6, "load gone: back to a high k"
    assert max_switches_per_minute(trace) <= 8


async def test_intermediate_load_steps_down_gradually(lab_profile: Profile) -> None:
    phases = [Phase(40, mix("maths"), concurrency=c) for c in (1, 4, 12)]
    trace = await run_phases(lab_profile, phases)
    ends = [min(settled_k(trace, 40.0 * (i + 1))) for i in range(3)]
    assert ends[0] > ends[2] > 0, ends
    assert ends == sorted(ends, reverse=True)


async def test_workload_shift_from_maths_to_chat_lowers_k(lab_profile: Profile) -> None:
    phases = [Phase(60, mix("maths"), concurrency=6), Phase(60, mix("chat"), concurrency=6)]
    trace = await run_phases(lab_profile, phases)
    maths_k, chat_k = settled_k(trace, 60), settled_k(trace, 120)
    assert max(chat_k) < min(maths_k), (maths_k, chat_k)
    assert max_switches_per_minute(trace) <= 8
