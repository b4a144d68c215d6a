"""One policy on one scenario in virtual time: the scenario's load on simulated workers
(``workers.sim.virtual.VirtualLab``), the policy ticking, a recorder sampling every worker each tick.

A run covers the scenario's phases, then a drain (no new arrivals, at most ``DRAIN_S``) so that requests that
arrived in time can finish, for latency figures only: at every phase boundary (and the warm-up's end) the run
records each request's output tokens so far, and goodput counts only tokens delivered inside the measured
window (``bench.policy.run_metrics``). Poisson ``load`` must be resolved to a rate first
(``bench.policy.load.resolve``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from bench.policy.capacity import MixPoint
from bench.policy.controller_lab import lab_fleet
from bench.policy.cost_meter import ControllerCostMeter, ModelCost
from bench.policy.policies import LabContext, LabPolicy
from bench.policy.routing import GatewayRouter, ModalPolicy, PlacingPolicy
from bench.policy.scenario import Scenario, ScenarioPhase, TrafficClass
from fleet.clock import ManualClock
from fleet.perf import Profile, load_profile
from fleet.speculation import Schedule
from workers.sim.arrivals import ArrivalProcess, Phase, PhasedLoad, RequestKind, WorkloadMix
from workers.sim.records import RequestRecord, RunRecords
from workers.sim.virtual import RecordSink, TickContext, VirtualLab, VirtualWorker, make_worker

DRAIN_S = 120.0
"""Longest virtual time the lab keeps running after the last phase, to let requests in flight finish."""
RECENT_REQUESTS_S = 120.0
"""A streaming run (``run_policy(sink=…)``) keeps the requests that arrived this far back (seconds) for the
policies' tick hooks (the fleet planner reads the last ``bench.policy.fleet_placement.WINDOW_S``)."""


@dataclass(frozen=True, slots=True)
class TickSample:
    """One worker at one tick: the schedule's k (the largest k of its table) and its queue."""

    t_s: float
    worker: int
    k: int
    running: int
    waiting: int


@dataclass
class RawRun:
    """What one run leaves for the metrics: the lab's records plus the tick samples."""

    scenario: Scenario
    policy: str
    records: RunRecords
    ticks: list[TickSample] = field(default_factory=list)
    schedule_changes: int = 0
    """Times a worker's applied schedule changed (every worker, the whole run)."""
    model_cost: ModelCost | None = None
    """The controller's cost model's totals over the measured span (``bench.policy.cost_meter``)."""
    marks: dict[float, list[int]] = field(default_factory=dict)
    """Boundary time (s) → output tokens so far of ``records.requests[i]`` at that time (requests that had not
    arrived yet are missing from the end of the list: zero)."""
    refused: tuple[tuple[int, str, str], ...] = ()
    """``(index in records.requests, worker id, tier)`` of the requests the gateway would have refused (503):
    their speculation mode left no worker (``bench.policy.routing.GatewayRouter.refused``)."""


def _kind(cls: TrafficClass, scenario: Scenario) -> RequestKind:
    return RequestKind(
        workload=cls.workload,
        prompt_tokens=cls.prompt_tokens,
        output_tokens=cls.output_tokens,
        weight=cls.weight,
        priority=scenario.tiers[cls.tier].priority,
        tag=cls.tier,
    )


def mix_point(phase: ScenarioPhase) -> MixPoint:
    """The phase's mean request shape, for capacity estimates."""
    total = sum(c.weight for c in phase.mix)
    return MixPoint(
        workloads=tuple((c.workload, c.weight) for c in phase.mix),
        prompt_tokens=sum(c.weight * c.prompt_tokens.mean for c in phase.mix) / total,
        output_tokens=sum(c.weight * c.output_tokens.mean for c in phase.mix) / total,
    )


def poisson_rate(scenario: Scenario, phase: ScenarioPhase) -> float:
    """Requests/s of the phase's Poisson component (0 for closed loops)."""
    arrival = phase.arrival
    base = arrival.base if arrival.kind == "burst" else arrival
    if base.kind != "poisson":
        return 0.0
    if base.rate_per_s is None:
        raise ValueError(
            f"{scenario.name}/{phase.name}: load {base.load} is unresolved; run bench.policy.load.resolve first"
        )
    return base.rate_per_s


def boundaries(scenario: Scenario) -> list[float]:
    """The times at which a run records every request's tokens so far: the warm-up's end and every phase's
    start and end, seconds."""
    marks = {scenario.warmup_s, *(t for _, a, b in scenario.phase_bounds() for t in (a, b))}
    return sorted(marks)


def build_load(scenario: Scenario) -> PhasedLoad:
    """The scenario as the lab's piecewise arrival process."""
    phases = []
    for p in scenario.phases:
        mix = WorkloadMix(tuple(_kind(c, scenario) for c in p.mix))
        arrival = p.arrival
        phases.append(
            Phase(
                duration_s=p.duration_s,
                mix=mix,
                concurrency=arrival.concurrency if arrival.kind == "closed" else 0,
                rate_per_s=poisson_rate(scenario, p),
                burst_size=arrival.size if arrival.kind == "burst" else 0,
                burst_every_s=arrival.every_s if arrival.kind == "burst" else 0.0,
                name=p.name,
            )
        )
    return PhasedLoad(phases)


def lab_context(scenario: Scenario) -> LabContext:
    return LabContext(
        profile_name=scenario.profile,
        tiers=scenario.tiers,
        tick_s=scenario.tick_s,
        gpus_per_worker=scenario.gpus,
        usd_per_gpu_hour=scenario.usd_per_gpu_hour,
        phase_bounds=tuple((p.name, a, b) for p, a, b in scenario.phase_bounds()),
    )


def make_workers(scenario: Scenario, profile: Profile, clock: ManualClock, start: Schedule) -> list[VirtualWorker]:
    """The scenario's workers, each starting on ``start``; priority scheduling when the tiers differ in it."""
    uses_priority = len({t.priority for t in scenario.tiers.values()}) > 1
    return [
        make_worker(
            profile,
            f"w{i}",
            clock,
            schedule=start,
            max_num_seqs=scenario.seqs,
            scheduling="priority" if uses_priority else "fcfs",
            seed=scenario.seed * 1000 + i,
        )
        for i in range(scenario.workers)
    ]


class RunSink(RecordSink, Protocol):
    """A streaming run's records go here instead of into ``RawRun`` (``bench.replay.stream_metrics``): steps and
    finished requests as they happen, tick samples, and the in-flight requests' tokens at every boundary."""

    def tick(self, sample: TickSample) -> None: ...

    def mark(self, t_s: float, in_flight: Iterable[RequestRecord]) -> None:
        """Boundary ``t_s`` reached: ``in_flight`` are the requests arrived and unfinished then."""
        ...

    def close(self, unfinished: Iterable[RequestRecord]) -> None:
        """The run ended (drain included); ``unfinished`` never finished."""
        ...


@dataclass
class _Recorder:
    """The lab's tick hook: lets the policy act, then samples every worker's schedule and queue."""

    policy: LabPolicy
    raw: RawRun
    last: list[Schedule]
    meter: ControllerCostMeter | None
    sink: RunSink | None = None

    def __call__(self, tick: TickContext) -> None:
        self.policy.on_tick(tick)
        if self.meter is not None:
            self.meter.on_tick(tick)
        for i, w in enumerate(tick.workers):
            schedule = w.control.schedule
            if schedule != self.last[i]:
                self.raw.schedule_changes += 1
                self.last[i] = schedule
            stats = w.stats
            sample = TickSample(tick.now_s, i, max(r[2] for r in schedule), stats.running, stats.waiting)
            if self.sink is None:
                self.raw.ticks.append(sample)
            else:
                self.sink.tick(sample)


def run_policy(
    scenario: Scenario,
    policy: LabPolicy,
    *,
    profile: Profile | None = None,
    priced: bool = True,
    load: ArrivalProcess | None = None,
    sink: RunSink | None = None,
) -> RawRun:
    """Run ``policy`` on ``scenario`` (bound to its profile; deterministic for the scenario's seed).
    ``priced=False`` leaves the controller's cost meter out (``model_cost`` stays None; capacity probes).
    ``load`` replaces the scenario's phases as the arrivals (a replayed trace, ``bench.replay``); the phases
    still bound the measured windows. ``sink``: stream the records there (the returned run then holds no
    requests, steps, ticks or marks; the same run either way)."""
    profile = profile or load_profile(scenario.profile)
    arrivals = load or build_load(scenario)
    clock = ManualClock()
    start = policy.start_schedule(k_max=profile.drafter.k_max, max_num_seqs=scenario.seqs)
    workers = make_workers(scenario, profile, clock, start)
    policy.bind(workers, lab_context(scenario))
    raw = RawRun(scenario=scenario, policy=policy.name, records=RunRecords(()))
    meter = (
        ControllerCostMeter(
            workers,
            profile,
            clock,
            tiers=scenario.tiers,
            tick_s=scenario.tick_s,
            start_s=scenario.warmup_s,
            end_s=scenario.duration_s,
        )
        if priced
        else None
    )
    router = GatewayRouter(
        fleet=lab_fleet(workers, profile),
        tiers=scenario.tiers,
        clock=clock,
        states=policy.published_states,
        seed=scenario.seed,
        placement=policy.placement if isinstance(policy, PlacingPolicy) else None,
        modes=policy.worker_modes if isinstance(policy, ModalPolicy) else None,
        profile=profile,
    )
    lab = VirtualLab(
        workers,
        arrivals,
        clock=clock,
        seed=scenario.seed,
        tick_s=scenario.tick_s,
        on_tick=_Recorder(policy, raw, [w.control.schedule for w in workers], meter, sink),
        router=router,
        record_steps=sink is None,
        sink=sink,
        keep_requests_s=RECENT_REQUESTS_S,
    )
    try:
        for t in boundaries(scenario):
            lab.run(t)
            if sink is None:
                raw.marks[t] = [r.output_tokens for r in lab.records.requests]
            else:
                sink.mark(t, lab.in_flight)
        drain_until = scenario.duration_s + DRAIN_S
        while any(w.outstanding for w in workers) and lab.now_s < drain_until:
            lab.run(min(lab.now_s + 10.0, drain_until))
        if sink is not None:
            sink.close(lab.in_flight)
    finally:
        policy.close()
        router.close()
        if meter is not None:
            meter.close()
    raw.records = lab.records if sink is None else RunRecords(lab.records.worker_ids)
    raw.refused = tuple(router.refused) if sink is None else ()  # streamed: the records are not kept whole
    raw.model_cost = meter.result() if meter is not None else None
    return raw
