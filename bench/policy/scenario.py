"""Scenario files: the load a policy is evaluated under (DESIGN §8).

A scenario is a sequence of *phases*; each phase has a duration (virtual seconds), an arrival process and a
traffic mix. A traffic class names a workload (acceptance class of the profile), an SLA tier and the request
length distributions. Poisson rates may be given absolutely (``rate_per_s``) or as a fraction of the fleet's
capacity (``load``) for that phase's mix, prefill included: the highest request rate at which the best static
k keeps every tier's SLA at 99 % without a growing backlog, measured by bisection in virtual time
(``bench.policy.load``), so a scenario keeps its meaning when the profile is recalibrated or changed.

A scenario runs on any profile of the family unless it names its ``profiles``; it is left out on a profile
whose ``serving.max_model_len`` or KV cache (``hardware.kv_capacity_tokens``) is below its longest request
(``context_tokens``). ``max_num_seqs`` and
``gpus_per_worker`` default to the profile's recipe (``serving.max_num_seqs``, ``hardware.gpus``);
``Scenario.on(profile)`` binds a scenario to one profile.

Files are YAML; a bad file raises ``fleet.config.ConfigError`` naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from fleet.config import ConfigError, TierConfig, load_yaml, parse_model
from fleet.perf import Profile
from workers.sim.arrivals import Lengths

SCENARIO_PACKAGE = "bench.policy.scenarios"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


SCENARIO_LENGTH_DEFAULTS: dict[str, float | int] = {"sigma": 0.5, "max": 1_000_000}
"""What a scenario file's length distribution means when it leaves a field out (the simulator's own
``Lengths`` defaults to exact lengths, ``sigma = 0``; scenario files default to a realistic spread)."""
_LENGTH_FIELDS = frozenset(f.name for f in dataclasses.fields(Lengths))


def _scenario_lengths(value: Any) -> Any:
    """A scenario file's ``{mean, sigma?, min?, max?}`` with the scenario defaults filled in; unknown keys are
    refused by name (pydantic would drop them silently on a dataclass)."""
    if not isinstance(value, dict):
        return value
    unknown = sorted(set(value) - _LENGTH_FIELDS)
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}; a length distribution has {sorted(_LENGTH_FIELDS)}")
    return {**SCENARIO_LENGTH_DEFAULTS, **value}


ScenarioLengths = Annotated[Lengths, BeforeValidator(_scenario_lengths)]
"""``workers.sim.arrivals.Lengths`` as a scenario file writes it (tokens)."""


class TrafficClass(_Strict):
    """One kind of request in a phase's mix."""

    workload: str = "chat"
    """Acceptance class of the profile (maths, code, chat, long-context, …)."""
    tier: str = "batch"
    """SLA tier name (from the scenario's ``tiers``)."""
    weight: Annotated[float, Field(gt=0)] = 1.0
    """Relative share of arrivals (or of closed-loop streams)."""
    prompt_tokens: ScenarioLengths = Lengths(mean=1000, sigma=0.5, max=1_000_000)
    output_tokens: ScenarioLengths = Lengths(mean=500, sigma=0.5, max=1_000_000)


class ClosedLoop(_Strict):
    """``concurrency`` streams, each sending its next request as soon as the previous one finishes."""

    kind: Literal["closed"] = "closed"
    concurrency: Annotated[int, Field(ge=1, le=4096)]
    """Concurrent streams across the whole fleet."""


class Poisson(_Strict):
    """Poisson arrivals at ``rate_per_s`` requests/s, or at ``load`` × the fleet's estimated capacity."""

    kind: Literal["poisson"] = "poisson"
    rate_per_s: Annotated[float, Field(gt=0)] | None = None
    load: Annotated[float, Field(gt=0, le=5)] | None = None
    """Offered load as a fraction of the fleet's capacity for this phase's mix (``bench.policy.load``)."""

    @model_validator(mode="after")
    def _one_of(self) -> Self:
        if (self.rate_per_s is None) == (self.load is None):
            raise ValueError("give exactly one of 'rate_per_s' or 'load'")
        return self


class Burst(_Strict):
    """Background Poisson load plus ``size`` requests arriving at once every ``every_s`` seconds."""

    kind: Literal["burst"] = "burst"
    base: Poisson
    size: Annotated[int, Field(ge=1)]
    every_s: Annotated[float, Field(gt=0)]


Arrival = Annotated[ClosedLoop | Poisson | Burst, Field(discriminator="kind")]


class ScenarioPhase(_Strict):
    """One phase of a scenario file (the lab resolves it into a ``workers.sim.arrivals.Phase``)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.@-]{1,48}$")]
    duration_s: Annotated[float, Field(gt=0)]
    """Virtual seconds."""
    arrival: Arrival
    mix: Annotated[tuple[TrafficClass, ...], Field(min_length=1)]


class Scenario(_Strict):
    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,47}$")]
    description: str
    profile: str = "kimi-k3-dspark-tp16"
    """The profile it runs on (``on(profile)`` sets it for a family run)."""
    profiles: tuple[str, ...] | None = None
    """The profiles it is meaningful for (None: every profile whose context fits)."""
    workers: Annotated[int, Field(ge=1, le=64)] = 2
    max_num_seqs: Annotated[int, Field(ge=1, le=4096)] | None = None
    """Most sequences a worker runs at once (None: the profile's ``serving.max_num_seqs``)."""
    gpus_per_worker: Annotated[int, Field(gt=0)] | None = None
    """GPUs a worker is paid for (None: the profile's ``hardware.gpus``)."""
    usd_per_gpu_hour: Annotated[float, Field(ge=0)] = 3.0
    seed: int = 1
    tick_s: Annotated[float, Field(gt=0)] = 2.0
    """Controller tick (virtual seconds)."""
    warmup_s: Annotated[float, Field(ge=0)] = 0.0
    """Requests arriving before this time are run but left out of the metrics."""
    mixed: bool = False
    """A mixed scenario (workloads, tiers or load change over time)."""
    follow_oracle: bool = False
    """The controller's settled k must follow the oracle's per phase: off where the oracle is off, on where it
    is on (``bench.policy.targets.T_FOLLOW``)."""
    plan_gain: bool = False
    """A scenario where the fleet plan must gain ≥ 1.10× what an operator already has (the day-long and the
    steady-batch scenarios of issue 25; ``bench.policy.plan_targets.T_GAIN``)."""
    tiers: dict[str, TierConfig] = Field(
        default_factory=lambda: {
            "interactive": TierConfig(priority=0, ttft_target_s=2.0, tpot_target_s=0.05),
            "batch": TierConfig(priority=10),
        }
    )
    phases: Annotated[tuple[ScenarioPhase, ...], Field(min_length=1)]

    @model_validator(mode="after")
    def _cross_check(self) -> Self:
        names = [p.name for p in self.phases]
        if len(set(names)) != len(names):
            raise ValueError(f"phases: duplicate phase name in {names}")
        for i, phase in enumerate(self.phases):
            for j, cls in enumerate(phase.mix):
                if cls.tier not in self.tiers:
                    raise ValueError(
                        f"phases[{i}].mix[{j}].tier: unknown tier {cls.tier!r}; known: {sorted(self.tiers)}"
                    )
        if self.warmup_s >= self.duration_s:
            raise ValueError(f"warmup_s: {self.warmup_s} is not below the scenario's duration {self.duration_s}")
        return self

    @property
    def seqs(self) -> int:
        """``max_num_seqs`` of a bound scenario (``on``)."""
        if self.max_num_seqs is None:
            raise ValueError(f"{self.name}: max_num_seqs is unset; bind the scenario with on(profile)")
        return self.max_num_seqs

    @property
    def gpus(self) -> int:
        """``gpus_per_worker`` of a bound scenario (``on``)."""
        if self.gpus_per_worker is None:
            raise ValueError(f"{self.name}: gpus_per_worker is unset; bind the scenario with on(profile)")
        return self.gpus_per_worker

    @property
    def context_tokens(self) -> int:
        """The longest request it can send (largest prompt + output bound), tokens."""
        return max(
            min(c.prompt_tokens.max, _far(c.prompt_tokens)) + min(c.output_tokens.max, _far(c.output_tokens))
            for p in self.phases
            for c in p.mix
        )

    def fits(self, profile: Profile) -> bool:
        """Whether the scenario is meaningful on ``profile``: named by ``profiles`` (or none named) and its
        longest request within the profile's ``serving.max_model_len`` and its KV cache."""
        named = self.profiles is None or profile.name in self.profiles
        room = min(profile.serving.max_model_len, int(profile.hardware.kv_capacity_tokens))
        return named and self.context_tokens <= room

    def on(self, profile: Profile) -> Scenario:
        """This scenario bound to ``profile``: its name, and the recipe's batch limit and GPUs where unset."""
        return self.model_copy(
            update={
                "profile": profile.name,
                "max_num_seqs": self.max_num_seqs or profile.serving.max_num_seqs,
                "gpus_per_worker": self.gpus_per_worker or profile.hardware.gpus,
            }
        )

    @property
    def duration_s(self) -> float:
        """Total virtual duration of all phases, seconds."""
        return sum(p.duration_s for p in self.phases)

    def phase_bounds(self) -> Iterator[tuple[ScenarioPhase, float, float]]:
        """Each phase with its ``[start_s, end_s)`` on the scenario clock."""
        start = 0.0
        for phase in self.phases:
            yield phase, start, start + phase.duration_s
            start += phase.duration_s

    def phase_at(self, t_s: float) -> ScenarioPhase:
        """The phase running at scenario time ``t_s`` (the last phase past the end)."""
        for phase, start, end in self.phase_bounds():
            if start <= t_s < end:
                return phase
        return self.phases[-1]

    def scaled(self, factor: float, *, name_suffix: str = "") -> Scenario:
        """This scenario with every phase (and the warm-up) ``factor`` times as long (for smoke runs)."""
        phases = tuple(p.model_copy(update={"duration_s": p.duration_s * factor}) for p in self.phases)
        update = {"phases": phases, "warmup_s": self.warmup_s * factor, "name": self.name + name_suffix}
        return self.model_copy(update=update)


def _far(lengths: Lengths) -> int:
    """A length the distribution exceeds with negligible probability (mean · e^(4σ)), tokens."""
    return int(lengths.mean * math.exp(4 * lengths.sigma)) + 1


def load_scenario(path: Path) -> Scenario:
    """Load and validate one scenario file."""
    scenario = parse_model(Scenario, load_yaml(path), source=str(path))
    if scenario.name != path.stem:
        raise ConfigError(f"{path}: name: {scenario.name!r} must match the file name {path.stem!r}")
    return scenario


def builtin_scenario_dir() -> Path:
    return Path(str(resources.files(SCENARIO_PACKAGE)))


def load_scenarios(directory: Path | None = None, names: list[str] | None = None) -> list[Scenario]:
    """Load every ``*.yaml`` scenario in ``directory`` (the built-in set by default), sorted by name,
    keeping only ``names`` when given (an unknown name is an error naming it)."""
    directory = directory or builtin_scenario_dir()
    found = {p.stem: p for p in sorted(directory.glob("*.yaml"))}
    if names:
        unknown = [n for n in names if n not in found]
        if unknown:
            raise ConfigError(f"scenario: unknown {unknown}; known: {sorted(found)}")
        found = {n: found[n] for n in names}
    return [load_scenario(p) for p in found.values()]
