"""What a scenario's ``load: 0.6`` means: 60 % of the fleet's measured capacity for that phase's mix.

**Capacity** is the highest Poisson request rate (requests/s, whole fleet) at which the best static k keeps
every tier's SLA at ≥ ``ATTAINMENT`` without a growing backlog, prefill included because the probes run the
engine, prompts and all. It is measured, not modelled: a bounded bisection in virtual time. Each probe runs
the phase's mix alone at one rate and one static k for ``PROBE_S`` seconds on the scenario's workers (routing,
scheduling and batch limit as in the scenario), and passes when, over ``[PROBE_WARMUP_S, PROBE_S)``, every
tier's SLA attainment (``bench.policy.run_metrics.verdicts``: tokens and verdicts at the window's end, no
drain) is ≥ ``ATTAINMENT`` and the backlog did not grow (``Backlog.growing``). The search starts from the
performance model's planning figure (``bench.policy.capacity.capacity_requests_per_s``): the bracket is
``[0, HEADROOM × model]``, widened by doubling (at most ``WIDEN`` times) while its top still passes, then
halved ``BISECT_STEPS`` times for the first candidate k; each further candidate k costs one probe just above
the best rate so far and is searched only if it passes there. The candidates are k = 0, the profile's k_max
and the model's best k at the full batch. The result is cached per (profile, mix, workers, batch limit,
tiers) for the process, and on disk by ``CapacityCache`` (``docs/benchmarks/policies-capacity.json``; the key
adds a digest of the profile and of the probe constants, so a recalibrated profile is measured again; a change
to the simulator itself needs ``gearshift bench policies --remeasure``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.policy.capacity import best_k, capacity_requests_per_s, max_batch
from bench.policy.lab import mix_point, run_policy
from bench.policy.policies import StaticSchedule
from bench.policy.run_metrics import backlog, verdicts
from bench.policy.scenario import Poisson, Scenario, ScenarioPhase, TrafficClass
from fleet.config import SpeculationMode
from fleet.perf import Profile

ATTAINMENT = 0.99
PROBE_S = 60.0
PROBE_WARMUP_S = 20.0
HEADROOM = 1.5
WIDEN = 2
BISECT_STEPS = 4
ABOVE = 1.02
"""A further candidate k is searched only if it passes at this factor above the best rate so far."""


@dataclass(frozen=True, slots=True)
class Capacity:
    """The measured capacity of a fleet for one mix."""

    rate_per_s: float
    """Requests/s (whole fleet); 0 when no probed rate passed."""
    k: int
    """The static k that reached it."""
    model_rate_per_s: float
    """The performance model's planning figure (best static k at the full batch), requests/s."""
    probes: int


def _probe_scenario(base: Scenario, mix: Sequence[TrafficClass], rate: float) -> Scenario:
    phase = ScenarioPhase(name="probe", duration_s=PROBE_S, arrival=Poisson(rate_per_s=rate), mix=tuple(mix))
    return base.model_copy(update={"phases": (phase,), "warmup_s": PROBE_WARMUP_S, "name": f"{base.name}-probe"})


def passes(base: Scenario, mix: Sequence[TrafficClass], rate: float, k: int, profile: Profile) -> bool:
    """Whether static ``k`` serves ``rate`` requests/s of ``mix`` on ``base``'s fleet (see the module)."""
    sc = _probe_scenario(base, mix, rate)
    raw = run_policy(sc, StaticSchedule.plain(k), profile=profile, priced=False)
    good = verdicts(raw)
    start, end = sc.warmup_s, sc.duration_s
    for tier in {c.tier for c in mix}:
        judged = [
            g
            for r, g in zip(raw.records.requests, good, strict=True)
            if r.tag == tier and start <= r.arrival_s < end and g is not None
        ]
        if judged and sum(judged) / len(judged) < ATTAINMENT:
            return False
    return not backlog(raw, start, end).growing


def _search(
    base: Scenario, mix: Sequence[TrafficClass], k: int, profile: Profile, lo: float, hi: float
) -> tuple[float, int]:
    """The highest passing rate in ``[lo, hi]`` (``lo`` assumed passing), and the probes spent."""
    probes = 0
    for _ in range(WIDEN):
        probes += 1
        if not passes(base, mix, hi, k, profile):
            break
        lo, hi = hi, 2 * hi
    else:
        return lo, probes
    for _ in range(BISECT_STEPS):
        mid = (lo + hi) / 2
        probes += 1
        if passes(base, mix, mid, k, profile):
            lo = mid
        else:
            hi = mid
    return lo, probes


def measure(base: Scenario, mix: Sequence[TrafficClass], profile: Profile) -> Capacity:
    """The fleet's capacity for ``mix`` on ``base``'s workers (``base`` bound to ``profile``). Every tier is probed
    as ``speculation: auto``: whether a request may be sent to a worker with its drafter is a routing promise, not
    the fleet's capacity (a static k on drafting workers could never keep an ``off`` tier's SLA)."""
    tiers = {name: t.model_copy(update={"speculation": SpeculationMode.AUTO}) for name, t in base.tiers.items()}
    base = base.model_copy(update={"tiers": tiers})
    point = mix_point(ScenarioPhase(name="mix", duration_s=1, arrival=Poisson(rate_per_s=1), mix=tuple(mix)))
    model = capacity_requests_per_s(profile, point, workers=base.workers, max_num_seqs=base.seqs)
    k_max = profile.drafter.k_max
    first = best_k(profile, point, max_batch(profile, point, base.seqs))
    candidates = list(dict.fromkeys((first, k_max, 0)))
    best_rate, best_k_found, probes = 0.0, first, 0
    for k in candidates:
        if best_rate > 0:
            probes += 1
            if not passes(base, mix, best_rate * ABOVE, k, profile):
                continue
            rate, spent = _search(base, mix, k, profile, best_rate * ABOVE, max(HEADROOM * model, 2 * best_rate))
        else:
            rate, spent = _search(base, mix, k, profile, 0.0, HEADROOM * model)
        probes += spent
        if rate > best_rate:
            best_rate, best_k_found = rate, k
    return Capacity(best_rate, best_k_found, model, probes)


def mix_key(scenario: Scenario, phase: ScenarioPhase) -> str:
    """The cache key of a phase's capacity: profile, mix, workers, batch limit and tiers (JSON)."""
    tiers = {c.tier: scenario.tiers[c.tier].model_dump(mode="json") for c in phase.mix}
    return json.dumps(
        {
            "profile": scenario.profile,
            "seed": scenario.seed,
            "workers": scenario.workers,
            "max_num_seqs": scenario.seqs,
            "mix": [c.model_dump(mode="json") for c in phase.mix],
            "tiers": tiers,
        },
        sort_keys=True,
    )


def load_phases(scenario: Scenario) -> list[ScenarioPhase]:
    """The phases whose Poisson rate is given as ``load``."""
    out = []
    for p in scenario.phases:
        base = p.arrival.base if p.arrival.kind == "burst" else p.arrival
        if base.kind == "poisson" and base.load is not None:
            out.append(p)
    return out


_CACHE: dict[str, Capacity] = {}


def capacity_for(scenario: Scenario, phase: ScenarioPhase, profile: Profile) -> Capacity:
    """``measure`` for the phase's mix, cached per ``mix_key``."""
    key = mix_key(scenario, phase)
    if key not in _CACHE:
        _CACHE[key] = measure(scenario, phase.mix, profile)
    return _CACHE[key]


def resolve(scenario: Scenario, capacities: Mapping[str, Capacity]) -> Scenario:
    """``scenario`` with every ``load`` replaced by ``load × capacity`` requests/s (``capacities`` by
    ``mix_key``)."""
    phases = []
    for p in scenario.phases:
        arrival = p.arrival
        base = arrival.base if arrival.kind == "burst" else arrival
        if base.kind == "poisson" and base.load is not None:
            rate = Poisson(rate_per_s=max(base.load * capacities[mix_key(scenario, p)].rate_per_s, 1e-6))
            arrival = arrival.model_copy(update={"base": rate}) if arrival.kind == "burst" else rate
            p = p.model_copy(update={"arrival": arrival})
        phases.append(p)
    return scenario.model_copy(update={"phases": tuple(phases)})


PROBE_CONSTANTS = (ATTAINMENT, PROBE_S, PROBE_WARMUP_S, HEADROOM, WIDEN, BISECT_STEPS, ABOVE)


def _digest(key: str, profile: Profile) -> str:
    body = json.dumps([key, profile.model_dump(mode="json"), PROBE_CONSTANTS], sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:24]


@dataclass
class CapacityCache:
    """Measured capacities kept in a JSON file: digest (``mix_key`` + profile + probe constants) → Capacity."""

    path: Path
    entries: dict[str, Capacity] = dataclasses.field(default_factory=dict)

    @classmethod
    def open(cls, path: Path) -> CapacityCache:
        if not path.exists():
            return cls(path)
        raw = json.loads(path.read_text())
        return cls(path, {k: Capacity(**v) for k, v in raw.items()})

    def get(self, key: str, profile: Profile) -> Capacity | None:
        return self.entries.get(_digest(key, profile))

    def put(self, key: str, profile: Profile, capacity: Capacity) -> None:
        self.entries[_digest(key, profile)] = capacity

    def save(self) -> None:
        body = {k: dataclasses.asdict(v) for k, v in sorted(self.entries.items())}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(body, indent=1) + "\n")
