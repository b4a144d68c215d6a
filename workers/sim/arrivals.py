"""Load for the virtual-time lab: workload mixes and arrival processes.

A *mix* says what requests look like (acceptance class, prompt and output lengths, priority); an *arrival
process* says when they come: a closed loop of N streams (each sends its next request when the previous one
finishes, after a think time), Poisson arrivals at a rate, bursts on top of Poisson, or a piecewise schedule
of phases that changes load and mix over time. All randomness comes from the ``random.Random`` the driver
passes in, so a run is a pure function of its seed.

Times are seconds of virtual time; lengths are tokens.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Lengths:
    """A token-length distribution: lognormal with this ``mean`` and shape ``sigma``, clipped to
    ``[min, max]`` tokens. ``sigma = 0`` always gives ``round(mean)``."""

    mean: float
    sigma: float = 0.0
    min: int = 1
    max: int = 10_000_000

    def __post_init__(self) -> None:
        if self.mean <= 0:
            raise ValueError(f"mean: must be > 0 tokens, got {self.mean}")
        if self.sigma < 0:
            raise ValueError(f"sigma: must be ≥ 0, got {self.sigma}")
        if not 1 <= self.min <= self.max:
            raise ValueError(f"min/max: need 1 ≤ min ≤ max, got {self.min}, {self.max}")

    def sample(self, rng: random.Random) -> int:
        if self.sigma == 0:
            value = self.mean
        else:
            mu = math.log(self.mean) - self.sigma**2 / 2  # so that E[value] = mean before clipping
            value = rng.lognormvariate(mu, self.sigma)
        return min(self.max, max(self.min, round(value)))


@dataclass(frozen=True, slots=True)
class RequestKind:
    """One kind of request in a mix; ``weight`` is its relative share of arrivals."""

    workload: str
    """Acceptance class of the profile (maths, code, chat, long-context, …)."""
    prompt_tokens: Lengths
    output_tokens: Lengths
    weight: float = 1.0
    priority: int = 0
    """vLLM priority (lower runs first under priority scheduling)."""
    tag: str = ""
    """Free label carried into the request records (e.g. an SLA tier name)."""

    def __post_init__(self) -> None:
        if self.weight <= 0:
            raise ValueError(f"weight: must be > 0, got {self.weight} for workload {self.workload!r}")


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """A request the load wants sent: what the engine needs, without an id or a time."""

    workload: str
    prompt_tokens: int
    max_tokens: int
    priority: int = 0
    tag: str = ""
    block_hashes: Sequence[int] = ()
    """Hashes of the prompt's full KV blocks, for the engines' prefix caches (``workers.sim.prompt_tokens``)."""


@dataclass(frozen=True, slots=True)
class WorkloadMix:
    """A mix of request kinds.

    With ``deck_size > 0`` kinds are dealt from a shuffled deck holding each kind in proportion to its weight
    (largest-remainder rounding), reshuffled when empty: every ``deck_size`` consecutive requests match the
    weights exactly, which keeps short runs from drifting off the intended mix. ``deck_size = 0`` draws each
    request independently.
    """

    kinds: tuple[RequestKind, ...]
    deck_size: int = 20

    def __post_init__(self) -> None:
        if not self.kinds:
            raise ValueError("kinds: a mix needs at least one request kind")
        if self.deck_size < 0:
            raise ValueError(f"deck_size: must be ≥ 0, got {self.deck_size}")

    @classmethod
    def single(cls, workload: str, prompt_tokens: Lengths, output_tokens: Lengths) -> WorkloadMix:
        return cls((RequestKind(workload, prompt_tokens, output_tokens),))

    def deck(self) -> list[int]:
        """Indices of ``kinds`` in the proportions of their weights, ``deck_size`` cards in all."""
        total = sum(k.weight for k in self.kinds)
        quotas = [k.weight / total * self.deck_size for k in self.kinds]
        counts = [math.floor(q) for q in quotas]
        by_remainder = sorted(range(len(quotas)), key=lambda i: (counts[i] - quotas[i], i))
        for i in by_remainder[: self.deck_size - sum(counts)]:
            counts[i] += 1
        return [i for i, n in enumerate(counts) for _ in range(n)]


@dataclass(slots=True)
class MixSampler:
    """Draws ``RequestSpec`` s from a mix with the driver's RNG."""

    mix: WorkloadMix
    _deck: list[int] = field(default_factory=list)

    def draw(self, rng: random.Random) -> RequestSpec:
        kind = self.mix.kinds[self._next_index(rng)]
        return RequestSpec(
            workload=kind.workload,
            prompt_tokens=kind.prompt_tokens.sample(rng),
            max_tokens=kind.output_tokens.sample(rng),
            priority=kind.priority,
            tag=kind.tag,
        )

    def _next_index(self, rng: random.Random) -> int:
        if self.mix.deck_size == 0 or len(self.mix.kinds) == 1:
            return rng.choices(range(len(self.mix.kinds)), weights=[k.weight for k in self.mix.kinds])[0]
        if not self._deck:
            self._deck = self.mix.deck()
            rng.shuffle(self._deck)
        return self._deck.pop()


# ------------------------------------------------------------------------------------------- processes
class LoadContext(Protocol):
    """What an arrival process may do: read the clock and schedule arrivals or callbacks (the driver)."""

    @property
    def now_s(self) -> float: ...
    @property
    def rng(self) -> random.Random: ...
    def submit_at(self, at_s: float, spec: RequestSpec, *, stream: int | None = None, phase: str = "") -> None:
        """Send ``spec`` at ``at_s``; ``stream`` marks a closed-loop stream (its finish is reported back)."""
        ...

    def call_at(self, at_s: float, callback: PhaseCallback) -> None: ...


class PhaseCallback(Protocol):
    def __call__(self, ctx: LoadContext) -> None: ...


class ArrivalProcess(Protocol):
    """Decides when requests arrive. The driver calls ``start`` once at time 0 and ``on_stream_done``
    whenever a closed-loop stream's request finishes (or is dropped)."""

    def start(self, ctx: LoadContext) -> None: ...
    def on_stream_done(self, stream: int, ctx: LoadContext) -> None: ...


@dataclass(frozen=True, slots=True)
class Phase:
    """One stretch of a load schedule: ``concurrency`` closed-loop streams and/or Poisson arrivals at
    ``rate_per_s`` (plus ``burst_size`` requests at once every ``burst_every_s``), drawn from ``mix``."""

    duration_s: float
    mix: WorkloadMix
    concurrency: int = 0
    rate_per_s: float = 0.0
    think_s: float = 0.0
    """Closed-loop pause between a stream's finish and its next request, seconds."""
    burst_size: int = 0
    burst_every_s: float = 0.0
    name: str = ""

    def __post_init__(self) -> None:
        if not self.duration_s > 0:
            raise ValueError(f"duration_s: must be > 0 (math.inf for an open end), got {self.duration_s}")
        if self.concurrency < 0 or self.rate_per_s < 0 or self.think_s < 0 or self.burst_size < 0:
            raise ValueError("concurrency, rate_per_s, think_s, burst_size: must be ≥ 0")
        if self.burst_size and not self.burst_every_s > 0:
            raise ValueError("burst_every_s: must be > 0 when burst_size is set")


class PhasedLoad:
    """A piecewise load schedule; the closed-loop and Poisson processes are one-phase special cases.

    At a phase start, closed-loop streams are added up to the phase's ``concurrency`` (streams beyond it stop
    after their current request) and the phase's Poisson/burst arrivals begin; they end with the phase.
    After the last phase (unless it is open-ended) no new requests are sent. A load keeps state (live
    streams, mix decks): give each lab its own.
    """

    def __init__(self, phases: Sequence[Phase]) -> None:
        if not phases:
            raise ValueError("phases: a load schedule needs at least one phase")
        self.phases = tuple(phases)
        self._samplers = [MixSampler(p.mix) for p in self.phases]
        self._current = 0
        self._live: set[int] = set()

    @property
    def duration_s(self) -> float:
        return sum(p.duration_s for p in self.phases)

    def start(self, ctx: LoadContext) -> None:
        start = 0.0
        for index, phase in enumerate(self.phases):
            ctx.call_at(start, _PhaseStart(self, index, start))
            start += phase.duration_s
            if math.isinf(start):
                break

    def on_stream_done(self, stream: int, ctx: LoadContext) -> None:
        phase = self.phases[self._current]
        if stream >= phase.concurrency or ctx.now_s >= self.duration_s:
            self._live.discard(stream)
            return
        self._submit(ctx, ctx.now_s + phase.think_s, stream)

    def _begin(self, index: int, start_s: float, ctx: LoadContext) -> None:
        self._current = index
        phase = self.phases[index]
        for stream in range(phase.concurrency):
            if stream not in self._live:
                self._live.add(stream)
                self._submit(ctx, start_s, stream)
        end_s = start_s + phase.duration_s
        if phase.rate_per_s > 0:
            ctx.call_at(start_s + ctx.rng.expovariate(phase.rate_per_s), _PoissonArrival(self, index, end_s))
        if phase.burst_size:
            ctx.call_at(start_s + phase.burst_every_s, _Burst(self, index, end_s))

    def _submit(self, ctx: LoadContext, at_s: float, stream: int | None, index: int | None = None) -> None:
        index = self._current if index is None else index
        spec = self._samplers[index].draw(ctx.rng)
        ctx.submit_at(at_s, spec, stream=stream, phase=self.phases[index].name)


@dataclass(frozen=True, slots=True)
class _PhaseStart:
    load: PhasedLoad
    index: int
    start_s: float

    def __call__(self, ctx: LoadContext) -> None:
        self.load._begin(self.index, self.start_s, ctx)


@dataclass(frozen=True, slots=True)
class _PoissonArrival:
    load: PhasedLoad
    index: int
    end_s: float

    def __call__(self, ctx: LoadContext) -> None:
        self.load._submit(ctx, ctx.now_s, None, self.index)
        following = ctx.now_s + ctx.rng.expovariate(self.load.phases[self.index].rate_per_s)
        if following < self.end_s:
            ctx.call_at(following, self)


@dataclass(frozen=True, slots=True)
class _Burst:
    load: PhasedLoad
    index: int
    end_s: float

    def __call__(self, ctx: LoadContext) -> None:
        phase = self.load.phases[self.index]
        for _ in range(phase.burst_size):
            self.load._submit(ctx, ctx.now_s, None, self.index)
        following = ctx.now_s + phase.burst_every_s
        if following < self.end_s:
            ctx.call_at(following, self)


def closed_loop(concurrency: int, mix: WorkloadMix, *, think_s: float = 0.0) -> PhasedLoad:
    """``concurrency`` streams, each sending its next request ``think_s`` after the previous one finishes."""
    return PhasedLoad([Phase(math.inf, mix, concurrency=concurrency, think_s=think_s, name="closed")])


def poisson(rate_per_s: float, mix: WorkloadMix) -> PhasedLoad:
    """Open-loop Poisson arrivals at ``rate_per_s`` requests per second."""
    if not rate_per_s > 0:
        raise ValueError(f"rate_per_s: must be > 0, got {rate_per_s}")
    return PhasedLoad([Phase(math.inf, mix, rate_per_s=rate_per_s, name="poisson")])


class TraceLoad:
    """Replays fixed arrivals: each ``(at_s, spec)`` is sent at ``at_s`` (open loop, no streams)."""

    def __init__(self, arrivals: Sequence[tuple[float, RequestSpec]], *, phase: str = "trace") -> None:
        self.arrivals = tuple(arrivals)
        self.phase = phase

    def start(self, ctx: LoadContext) -> None:
        for at_s, spec in self.arrivals:
            ctx.submit_at(at_s, spec, phase=self.phase)

    def on_stream_done(self, stream: int, ctx: LoadContext) -> None:
        """Trace arrivals belong to no stream; nothing to do."""
