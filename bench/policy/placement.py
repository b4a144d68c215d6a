"""The best static placement, found in hindsight (issue 13's ceiling), and the knee of a mixed-tier load.

**Search space.** Two pools, A and B, of identical workers (``n_A`` = 1 … n − 1). Every traffic class
(tier/workload) sends a share of its requests to pool A in steps of ``1 / SHARE_STEPS`` (the rest to B),
fixed for the run; each pool runs one static k from the workers' full-speed gears (0 … k_max) and one
per-worker concurrency cap from ``CAPS`` (below the recipe's ``max_num_seqs``, or none). One pool for all (a
uniform static k) is the suite's static runs, so the ceiling is never below the best uniform static k.

**Method.** Exhaustive over pool sizes and shares; for each (pool size, shares) the two pools are independent
(no spill in a static placement), so each pool's (k, cap) is chosen separately by the planner's steady-state
model (``controller.planner.evaluate_pool``) on the scenario's known loads (hindsight: each phase's rate and
mean lengths per class, the profile's acceptance), maximising the tokens within SLA summed over the phases.
The ``TOP_N`` distinct placements the model ranks highest are then run in the virtual lab on the scenario's
trace, and the best measured goodput is the ceiling (with the best uniform static k). So the ceiling is a
lower bound on the true static optimum, found by a search whose size ``search_size`` states: the model
screens it, the lab decides among the best.

**Knee** (``knee_rate``): the Poisson rate at which the best uniform static k first drops below
``KNEE_ATTAINMENT`` interactive SLA attainment, by bisection in virtual time (``KNEE_STEPS`` halvings of
``[KNEE_LO, KNEE_HI]`` × the scenario phase's own rate, every static k of the suite at each probe, each probe
``KNEE_PROBE_S`` long with ``KNEE_WARMUP_S`` of warm-up).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from bench.policy.fleet_placement import STATIC_TTL_S, StaticPlacement
from bench.policy.lab import run_policy
from bench.policy.policies import StaticSchedule
from bench.policy.run_metrics import RunMetrics, summarise, verdicts
from bench.policy.scenario import Poisson, Scenario, ScenarioPhase
from controller.planner import ClassLoad, PlannerConfig, evaluate_pool, prior_accepted_length
from fleet.perf import Profile, load_profile
from fleet.plan import FleetPlan, PoolPlan, TrafficClass, traffic_class

SHARE_STEPS = 8
CAPS: tuple[int | None, ...] = (None, 16, 32, 64)
TOP_N = 3
POOL_A, POOL_B = "a", "b"
KNEE_ATTAINMENT = 0.99
KNEE_LO, KNEE_HI = 0.5, 1.5
KNEE_STEPS = 4
KNEE_PROBE_S, KNEE_WARMUP_S = 120.0, 30.0


def is_mixed_tier(scenario: Scenario) -> bool:
    """A scenario with, in one phase, a class whose tier has a TPOT target and one whose tier has none."""
    for phase in scenario.phases:
        targets = {scenario.tiers[c.tier].tpot_target_s is not None for c in phase.mix}
        if targets == {True, False}:
            return True
    return False


def searchable(scenario: Scenario) -> bool:
    """Whether the suite searches a static placement for ``scenario``: mixed-tier, two or more workers."""
    return scenario.workers >= 2 and is_mixed_tier(scenario)


def has_knee(scenario: Scenario) -> bool:
    """Whether the suite measures ``scenario``'s knee: one Poisson phase, mixed-tier, four or more workers."""
    return scenario.workers >= 4 and len(scenario.phases) == 1 and is_mixed_tier(scenario) and (
        poisson_rate_of(scenario.phases[0]) > 0
    )  # fmt: skip


def poisson_rate_of(phase: ScenarioPhase) -> float:
    """The phase's resolved Poisson rate (requests/s; 0 for other arrivals or an unresolved load)."""
    arrival = phase.arrival
    return arrival.rate_per_s or 0.0 if arrival.kind == "poisson" else 0.0


def _rate(phase: ScenarioPhase) -> float:
    arrival = phase.arrival
    base = arrival.base if arrival.kind == "burst" else arrival
    rate = base.rate_per_s or 0.0 if base.kind == "poisson" else 0.0
    return rate + (arrival.size / arrival.every_s if arrival.kind == "burst" else 0.0)


def scenario_loads(scenario: Scenario, profile: Profile) -> list[ClassLoad]:
    """Each class's duration-weighted arrival rate and mean lengths over the scenario (loads resolved), with
    the profile's accepted length: what hindsight knows."""
    return _loads(scenario, scenario.phases, profile)


def phase_loads(scenario: Scenario, profile: Profile) -> list[tuple[float, list[ClassLoad]]]:
    """Per phase: its duration (s) and its classes' loads (``scenario_loads`` of the phase alone)."""
    return [(p.duration_s, _loads(scenario, (p,), profile)) for p in scenario.phases]


def _loads(scenario: Scenario, phases: Sequence[ScenarioPhase], profile: Profile) -> list[ClassLoad]:
    total = sum(p.duration_s for p in phases)
    acc: dict[TrafficClass, list[float]] = {}
    tiers: dict[TrafficClass, str] = {}
    for phase in phases:
        weight = sum(c.weight for c in phase.mix)
        for c in phase.mix:
            name = traffic_class(c.tier, c.workload)
            rate = _rate(phase) * c.weight / weight * phase.duration_s / total
            row = acc.setdefault(name, [0.0, 0.0, 0.0])
            row[0] += rate
            row[1] += rate * c.prompt_tokens.mean
            row[2] += rate * c.output_tokens.mean
            tiers[name] = c.tier
    out = []
    for name, (rate, prompt, output) in acc.items():
        if rate <= 0:
            continue
        p, o = prompt / rate, output / rate
        al = prior_accepted_length(profile, name.partition("/")[2], p + o / 2)
        out.append(ClassLoad(name, scenario.tiers[tiers[name]], rate, p, o, al))
    return out


@dataclass(frozen=True)
class PlacementChoice:
    """One static placement of the search, with the model's prediction."""

    plan: FleetPlan
    shares: dict[TrafficClass, dict[str, float]]
    predicted_tok_s: float

    def describe(self) -> str:
        pools = ", ".join(
            f"{p.name}: {len(p.workers)}×k={p.k}" + (f" cap {p.max_concurrency}" if p.max_concurrency else "")
            for p in self.plan.pools
        )
        shares = ", ".join(
            f"{c} {s.get(POOL_A, 0.0) * SHARE_STEPS:.0f}/{SHARE_STEPS}→a" for c, s in self.shares.items()
        )
        return f"{pools}; {shares}"


def _caps(seqs: int) -> list[int]:
    return sorted({seqs if c is None or c >= seqs else c for c in CAPS})


def search_size(classes: int, workers: int, gears: int, seqs: int) -> int:
    """Placements in the space: pool sizes × share vectors × (k, cap) of each pool."""
    per_pool = gears * len(_caps(seqs))
    shares: int = (SHARE_STEPS + 1) ** classes
    return (workers - 1) * shares * per_pool * per_pool


def _best_pool(profile: Profile, phases: Sequence[tuple[float, Sequence[tuple[ClassLoad, float]]]], n: int,
               seqs: int, cfg: PlannerConfig) -> tuple[int, int, float]:  # fmt: skip
    """The (k, cap) with the most predicted tokens within SLA over the phases (duration × goodput), and
    that figure over the whole duration, tok/s."""
    total = sum(d for d, _ in phases)
    best: tuple[float, int, int] | None = None
    for k in range(profile.drafter.k_max + 1):
        for cap in _caps(seqs):
            good = sum(
                d * evaluate_pool(profile, loads, workers=n, k=k, cap=cap, cfg=cfg).goodput_tok_s for d, loads in phases
            )
            if best is None or good > best[0] + 1e-9:
                best = (good, k, cap)
    assert best is not None
    return best[1], best[2], best[0] / total


def search(scenario: Scenario, profile: Profile, *, top: int = TOP_N) -> list[PlacementChoice]:
    """The ``top`` two-pool placements the model ranks highest (see the module docstring), best first."""
    classes = scenario_loads(scenario, profile)
    by_phase = [(d, {c.name: c for c in loads}) for d, loads in phase_loads(scenario, profile)]
    workers = [f"w{i}" for i in range(scenario.workers)]
    seqs, cfg = scenario.seqs, PlannerConfig()
    cache: dict[tuple[int, tuple[int, ...]], tuple[int, int, float]] = {}
    found: list[PlacementChoice] = []
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for n_a in range(1, len(workers)):
        for steps in itertools.product(range(SHARE_STEPS + 1), repeat=len(classes)):
            if all(s == 0 for s in steps) or all(s == SHARE_STEPS for s in steps):
                continue  # every class in one pool: the other pool idles (a uniform fleet does better)
            if (len(workers) - n_a, tuple(SHARE_STEPS - s for s in steps)) in seen:
                continue  # the mirror image of one already ranked (pools A and B swapped)
            seen.add((n_a, steps))
            sides = {}
            for side, n in ((POOL_A, n_a), (POOL_B, len(workers) - n_a)):
                mine = tuple(s if side == POOL_A else SHARE_STEPS - s for s in steps)
                if (n, mine) not in cache:
                    phases = [
                        (d, [(at[c.name], at[c.name].rate_req_s * s / SHARE_STEPS)
                             for c, s in zip(classes, mine, strict=True) if c.name in at])
                        for d, at in by_phase
                    ]  # fmt: skip
                    cache[n, mine] = _best_pool(profile, phases, n, seqs, cfg)
                sides[side] = cache[n, mine]
            (k_a, cap_a, good_a), (k_b, cap_b, good_b) = sides[POOL_A], sides[POOL_B]
            plan = FleetPlan(
                model="placement",
                version=1,
                issued_at=0.0,
                ttl_s=STATIC_TTL_S,
                pools=[
                    PoolPlan(name=POOL_A, classes=[c.name for c in classes], workers=workers[:n_a], k=k_a,
                             max_concurrency=None if cap_a >= seqs else cap_a),
                    PoolPlan(name=POOL_B, classes=[c.name for c in classes], workers=workers[n_a:], k=k_b,
                             max_concurrency=None if cap_b >= seqs else cap_b),
                ],
            )  # fmt: skip
            shares = {
                c.name: {POOL_A: s / SHARE_STEPS, POOL_B: 1 - s / SHARE_STEPS}
                for c, s in zip(classes, steps, strict=True)
            }
            found.append(PlacementChoice(plan, shares, good_a + good_b))
    found.sort(key=lambda c: -c.predicted_tok_s)
    return found[:top]


@dataclass(frozen=True)
class Ceiling:
    """The best static placement the search found, measured, and every candidate it ran."""

    metrics: RunMetrics
    choice: PlacementChoice
    tried: tuple[tuple[PlacementChoice, float], ...]
    """Each verified candidate and its measured goodput, tok/s."""
    size: int
    """Placements in the search space."""


def best_static_placement(scenario: Scenario, *, name: str, top: int = TOP_N) -> Ceiling:
    """Search ``scenario`` (bound, loads resolved) and run the ``top`` candidates; the best measured."""
    profile = load_profile(scenario.profile)
    choices = search(scenario, profile, top=top)
    if not choices:
        raise ValueError(f"{scenario.name}: no two-pool placement (one worker?)")
    runs = []
    for i, choice in enumerate(choices):
        policy = StaticPlacement(f"{name}#{i + 1}", choice.plan.model_copy(update={"model": "kimi-k3"}), choice.shares)
        runs.append((choice, summarise(run_policy(scenario, policy, profile=profile), profile)))
    choice, best = max(runs, key=lambda cm: cm[1].goodput_tok_s)
    best.policy = name
    size = search_size(len(choice.shares), scenario.workers, profile.drafter.k_max + 1, scenario.seqs)
    return Ceiling(best, choice, tuple((c, m.goodput_tok_s) for c, m in runs), size)


def _interactive_attainment(scenario: Scenario, k: int, profile: Profile) -> float:
    raw = run_policy(scenario, StaticSchedule.plain(k), profile=profile, priced=False)
    good = verdicts(raw)
    start, end = scenario.warmup_s, scenario.duration_s
    judged = [
        g
        for r, g in zip(raw.records.requests, good, strict=True)
        if start <= r.arrival_s < end and g is not None and scenario.tiers[r.tag].tpot_target_s is not None
    ]
    return sum(judged) / len(judged) if judged else 1.0


def knee_rate(scenario: Scenario, phase: ScenarioPhase, around_rate: float, ks: Sequence[int]) -> float:
    """The highest probed Poisson rate (requests/s) of ``phase``'s mix in ``[KNEE_LO, KNEE_HI] × around_rate``
    at which some static k in ``ks`` keeps interactive SLA attainment ≥ ``KNEE_ATTAINMENT`` (0: not even at the
    bracket's bottom; its top: the knee lies above the bracket)."""
    profile = load_profile(scenario.profile)

    def passes(rate: float) -> bool:
        probe = phase.model_copy(update={"arrival": Poisson(rate_per_s=rate), "duration_s": KNEE_PROBE_S})
        sc = scenario.model_copy(update={"phases": (probe,), "warmup_s": KNEE_WARMUP_S})
        return any(_interactive_attainment(sc, k, profile) >= KNEE_ATTAINMENT for k in ks)

    lo, hi = KNEE_LO * around_rate, KNEE_HI * around_rate
    if not passes(lo):
        return 0.0
    if passes(hi):
        return hi
    for _ in range(KNEE_STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    return lo
