"""The virtual-time driver: simulated workers on a discrete-event clock (DESIGN §4, "one engine core, two
clocks").

``VirtualLab`` runs one or many ``EngineCore`` s under an arrival process on a ``ManualClock``. Events are
engine-step ends, arrivals, load callbacks and control ticks, processed in time order (ties: step ends, then
load callbacks, then arrivals, then ticks; then in scheduling order), so a run is a pure function of its
seeds. A worker whose engine has work starts its next step the moment the previous one ends; requests that
arrive during a step join the next one, as in vLLM.

Every ``tick_s`` of virtual time the lab calls ``on_tick(TickContext)``: the controller and the bench plug
their control loop in there (scrape ``worker.metrics_text()`` or read ``worker.stats``, apply a
``SpeculationUpdate`` to ``worker.control``).

Times are seconds of virtual time since the start of the run (``clock.monotonic()``); the speculation
controls see ``clock.wall()``.

Example::

    clock = ManualClock()
    workers = [make_worker(profile, f"w{i}", clock, k=8, seed=i) for i in range(2)]
    lab = VirtualLab(workers, closed_loop(16, mix), clock=clock, seed=1)
    records = lab.run(60.0)
    print(records.throughput(10.0, 60.0))
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol, cast

from fleet.clock import ManualClock
from fleet.perf import IdleDrafterMode, Profile
from fleet.speculation import Schedule, SpeculationControl, uniform_schedule
from workers.sim.adaptive import AdaptiveVerification
from workers.sim.arrivals import ArrivalProcess, PhaseCallback, RequestSpec
from workers.sim.engine import EngineCore, SimRequest, StepOutcome
from workers.sim.exposition import SimWorkerMetrics
from workers.sim.records import RequestRecord, RunRecords, StepRecord
from workers.sim.scheduler import SchedulingPolicy
from workers.sim.stats import EngineStats

DEFAULT_MODEL_NAME = "kimi-k3"


@dataclass(eq=False)
class VirtualWorker:
    """One simulated worker in the lab: its engine, its speculation control and its load."""

    worker_id: str
    engine: EngineCore
    model_name: str = DEFAULT_MODEL_NAME
    outstanding: int = 0
    """Requests sent to this worker and not finished yet."""
    busy: bool = False
    """True while a step is in flight."""
    offline_until_s: float = 0.0
    """Lab seconds until which the worker takes no steps (restarting: ``bench.policy.drafter_free_lab``)."""

    @property
    def control(self) -> SpeculationControl:
        return self.engine.control

    @property
    def stats(self) -> EngineStats:
        """Live counters and gauges (refreshed on every access)."""
        return self.engine.stats

    @cached_property
    def _metrics(self) -> SimWorkerMetrics:
        return SimWorkerMetrics(
            lambda: self.engine.stats,
            self.control,
            model_name=self.model_name,
            adaptive_verification=lambda: self.engine.adaptive is not None,
        )

    def metrics_text(self) -> bytes:
        """The worker's ``/metrics`` exposition now (vLLM 0.32 names), as a scrape would see it."""
        return self._metrics.render()

    def metrics_samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        """The samples of ``metrics_text()``, without rendering the text (the lab's controller reads these)."""
        return self._metrics.samples()


def make_worker(
    profile: Profile,
    worker_id: str,
    clock: ManualClock,
    *,
    k: int | None = None,
    schedule: Schedule | None = None,
    max_num_seqs: int = 256,
    scheduling: SchedulingPolicy = "fcfs",
    seed: int = 0,
    kv_capacity_tokens: int | None = None,
    model_name: str = DEFAULT_MODEL_NAME,
    adaptive_verification: bool = False,
    drafter_loaded: bool = True,
    idle_drafter: IdleDrafterMode = IdleDrafterMode.STOCK,
) -> VirtualWorker:
    """A worker whose start-up (fallback) schedule is ``schedule``, or the plain ``k`` (default: k_max).
    ``adaptive_verification``: the engine sizes each step's verification itself, the schedule's k is its cap
    (``workers.sim.adaptive``). ``drafter_loaded``: started with its drafter, so k = 0 pays the idle-drafter tax
    (False: a worker started without speculation, which decodes at k = 0); ``idle_drafter``: which tax term
    (vLLM's own or the gearshift plugin's skip, ``fleet.perf.IdleDrafterMode``)."""
    if schedule is None:
        schedule = uniform_schedule(profile.drafter.k_max if k is None else k, max_num_seqs=max_num_seqs)
    control = SpeculationControl(
        worker_id=worker_id,
        method="dspark",
        k_max=profile.drafter.k_max,
        max_num_seqs=max_num_seqs,
        fallback=schedule,
        clock=clock,
    )
    engine = EngineCore(
        profile,
        control,
        max_num_seqs=max_num_seqs,
        scheduling=scheduling,
        seed=seed,
        kv_capacity_tokens=kv_capacity_tokens,
        adaptive=AdaptiveVerification() if adaptive_verification else None,
        drafter_loaded=drafter_loaded,
        idle_drafter=idle_drafter,
    )
    return VirtualWorker(worker_id, engine, model_name)


class Router(Protocol):
    """Chooses the worker (its index in ``workers``) for a new request."""

    def choose(self, workers: Sequence[VirtualWorker], spec: RequestSpec) -> int: ...


class LeastOutstandingRouter:
    """The default router: the worker with the fewest outstanding requests, the lowest index on ties."""

    def choose(self, workers: Sequence[VirtualWorker], spec: RequestSpec) -> int:
        best = 0
        for i in range(1, len(workers)):
            if workers[i].outstanding < workers[best].outstanding:
                best = i
        return best


@dataclass(frozen=True)
class TickContext:
    """What the tick hook sees: the time, the workers (controls, stats, metrics) and the records so far."""

    now_s: float
    clock: ManualClock
    workers: Sequence[VirtualWorker]
    records: RunRecords


TickHook = Callable[[TickContext], None]


class RecordSink(Protocol):
    """Where a streaming lab sends its records instead of keeping them (``VirtualLab.sink``): every engine step
    as it ends, every request as it finishes (in the order the lab handles them)."""

    def step(self, record: StepRecord) -> None: ...

    def finished(self, record: RequestRecord) -> None: ...


# Event kinds, in the order they are handled at equal times.
_STEP_END, _CALL, _ARRIVAL, _TICK = 0, 1, 2, 3


@dataclass(slots=True)
class _Arrival:
    spec: RequestSpec
    stream: int | None
    phase: str


@dataclass
class VirtualLab:
    """Discrete-event driver of ``workers`` under ``load``; see the module docstring."""

    workers: Sequence[VirtualWorker]
    load: ArrivalProcess
    clock: ManualClock = field(default_factory=ManualClock)
    seed: int = 0
    """Seeds the arrival process (lengths, mix, Poisson gaps); engines carry their own seeds."""
    tick_s: float | None = None
    on_tick: TickHook | None = None
    router: Router = field(default_factory=LeastOutstandingRouter)
    record_steps: bool = True
    """Keep a ``StepRecord`` per engine step (``RunRecords.throughput`` and friends need them)."""
    sink: RecordSink | None = None
    """Streaming: steps and finished requests go to the sink, and ``records`` keeps no steps and only the
    requests that arrived within the last ``keep_requests_s`` (memory bounded by the load, not the run)."""
    keep_requests_s: float = 0.0
    """With a sink: how far back ``records.requests`` reaches at a tick (seconds of virtual time; a tick hook that
    reads recent arrivals needs at least its own window)."""

    def __post_init__(self) -> None:
        if not self.workers:
            raise ValueError("workers: the lab needs at least one worker")
        if self.tick_s is not None and not self.tick_s > 0:
            raise ValueError(f"tick_s: must be > 0 seconds, got {self.tick_s}")
        self.records = RunRecords(tuple(w.worker_id for w in self.workers))
        self._rng = random.Random(self.seed)
        self._now = 0.0
        self._events: list[tuple[float, int, int, object]] = []
        self._order = itertools.count()
        self._ids = itertools.count()
        self._in_flight: dict[str, RequestRecord] = {}
        self._outcomes: dict[int, tuple[float, StepOutcome]] = {}
        self._started = False
        self._dirty: set[int] = set()
        """Workers to consider for a new step once the events of the current instant are handled."""

    # ------------------------------------------------------------------------------ LoadContext protocol
    @property
    def now_s(self) -> float:
        return self._now

    @property
    def rng(self) -> random.Random:
        return self._rng

    def submit_at(self, at_s: float, spec: RequestSpec, *, stream: int | None = None, phase: str = "") -> None:
        self._push(max(at_s, self._now), _ARRIVAL, _Arrival(spec, stream, phase))

    def call_at(self, at_s: float, callback: PhaseCallback) -> None:
        self._push(max(at_s, self._now), _CALL, callback)

    # ---------------------------------------------------------------------------------------- running
    def run(self, until_s: float) -> RunRecords:
        """Advance virtual time to ``until_s`` (seconds since the start); may be called again to go on.
        Steps in flight at ``until_s`` complete in a later call."""
        if until_s < self._now:
            raise ValueError(f"until_s: {until_s} is before the lab's current time {self._now}")
        if not self._started:
            self._started = True
            self.load.start(self)
            if self.tick_s is not None and self.on_tick is not None:
                self._push(self.tick_s, _TICK, None)
        events = self._events
        while events and events[0][0] <= until_s:
            now = events[0][0]
            self._advance(now)
            while events and events[0][0] == now:
                _, kind, _, payload = heapq.heappop(events)
                self._dispatch(kind, payload)
            self._start_idle_workers()
        self._advance(until_s)
        return self.records

    def _dispatch(self, kind: int, payload: object) -> None:
        if kind == _STEP_END:
            self._finish_step(cast(int, payload))
        elif kind == _ARRIVAL:
            self._arrive(cast(_Arrival, payload))
        elif kind == _CALL:
            cast(PhaseCallback, payload)(self)
        else:
            self._tick()

    def _tick(self) -> None:
        if self.tick_s is None or self.on_tick is None:
            raise RuntimeError("tick scheduled without tick_s and on_tick")
        if self.sink is not None:
            self._forget_requests_before(self._now - self.keep_requests_s)
        self.on_tick(TickContext(self._now, self.clock, self.workers, self.records))
        self._push(self._now + self.tick_s, _TICK, None)
        self._dirty.update(i for i, w in enumerate(self.workers) if w.offline_until_s)  # one back from a restart

    def _forget_requests_before(self, t_s: float) -> None:
        requests = self.records.requests
        cut = bisect.bisect_left(requests, t_s, key=lambda r: r.arrival_s)
        if cut:
            del requests[:cut]

    @property
    def in_flight(self) -> Iterator[RequestRecord]:
        """The requests that arrived and have not finished, in arrival order."""
        return iter(self._in_flight.values())

    def _arrive(self, arrival: _Arrival) -> None:
        spec = arrival.spec
        index = self.router.choose(self.workers, spec)
        worker = self.workers[index]
        rid = f"r{next(self._ids)}"
        record = RequestRecord(
            request_id=rid,
            worker_id=worker.worker_id,
            workload=spec.workload,
            prompt_tokens=spec.prompt_tokens,
            max_tokens=spec.max_tokens,
            arrival_s=self._now,
            stream=arrival.stream,
            phase=arrival.phase,
            tag=spec.tag,
            priority=spec.priority,
        )
        request = SimRequest(
            rid, spec.prompt_tokens, spec.max_tokens, spec.workload, spec.priority, self._now, spec.block_hashes
        )
        worker.engine.add(request)
        worker.outstanding += 1
        self._dirty.add(index)
        self.records.requests.append(record)
        self._in_flight[rid] = record

    def _start_idle_workers(self) -> None:
        """Start a step on every worker that became idle or got a request at this instant and has work."""
        dirty, self._dirty = self._dirty, set()
        for index in sorted(dirty):
            worker = self.workers[index]
            if worker.busy or worker.offline_until_s > self._now or not worker.engine.has_work():
                continue
            engine = worker.engine
            engine.now_s = self._now
            outcome = engine.step()
            if outcome.duration_s <= 0:
                continue  # nothing schedulable (cannot happen with a positive step overhead); wait for news
            worker.busy = True
            self._outcomes[index] = (self._now, outcome)
            self._push(self._now + outcome.duration_s, _STEP_END, index)

    def _finish_step(self, index: int) -> None:
        worker = self.workers[index]
        start_s, out = self._outcomes.pop(index)
        now = self._now
        worker.busy = False
        self._dirty.add(index)
        worker.engine.now_s = now
        in_flight = self._in_flight
        emitted = out.emitted
        for rid, n in emitted.items():
            record = in_flight[rid]
            if not record.output_tokens:
                record.first_token_s = now
            record.output_tokens += n
        sink = self.sink
        if self.record_steps or sink is not None:
            step = StepRecord(
                index,
                start_s,
                out.duration_s,
                out.k,
                out.decode_seqs,
                out.prefill_tokens,
                sum(emitted.values()),
                out.target_s,
                out.drafter_s,
            )
            if self.record_steps:
                self.records.steps.append(step)
            if sink is not None:
                sink.step(step)
        for rid in out.finished:
            record = in_flight.pop(rid)
            record.finish_s = now
            worker.outstanding -= 1
            if sink is not None:
                sink.finished(record)
            if record.stream is not None:
                self.load.on_stream_done(record.stream, self)

    # ---------------------------------------------------------------------------------------- helpers
    def _push(self, at_s: float, kind: int, payload: object) -> None:
        heapq.heappush(self._events, (at_s, kind, next(self._order), payload))

    def _advance(self, to_s: float) -> None:
        if to_s > self._now:
            self.clock.advance(to_s - self._now)
            self._now = to_s
