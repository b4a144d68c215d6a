"""The policy comparison: every policy on every scenario on every profile of the family, the same seeded trace
for all, then the oracle.

Policies: static k ∈ ``static_ks(profile)`` (0, 1, 2, 4 and the profile's k_max, which is the recipe default:
vLLM's recipe runs DSpark at fixed k = k_max), the two tuned tables below, and every policy of
``bench.policy.policies.LAB_POLICIES`` (the controller, adaptive verification, …: a policy added there is run
here without further wiring). Before the runs, every Poisson ``load`` is resolved to a rate from the fleet's
measured capacity for that phase's mix on that profile (``bench.policy.load``).

Baselines tuned offline from the shared performance model for each scenario's traffic mix:

- ``vllm-table``: vLLM's ``num_speculative_tokens_per_batch_size`` table with the best static k for each
  batch-size band (1, 2–3, 4–7, … , 128–max), applied by the engine per step on the instantaneous batch;
- ``gate``: k = the best k at batch 1 up to a threshold batch, 0 above it; the threshold is the smallest batch at
  which the best k > 0 gains less than ``GATE_MIN_GAIN`` over k = 0 on the profile.

Every policy runs on workers started with their drafter, so k = 0 (static, or a controller's "off") pays the
idle-drafter tax (``fleet.perf.IdleDrafterTax``). ``no-drafter`` is the reference without it: k = 0 on workers
started without speculation, what an operator who never speculates deploys. It is reported beside the others and
is not a candidate of the oracle (the oracle switches k, which needs the drafter).

The k oracle (``oracle-k``) runs after the static runs: for each phase, the static k with the highest goodput in
that phase. The honest references of issue 25 are composed from the measured runs afterwards
(``bench.policy.references``): ``oracle`` (per phase the best of every static k, the tuned table and
``no-drafter``, a switch to or from ``no-drafter`` paying ``restart_s``) and ``best-fleet-plan`` (the same with
the best static placement), each at restart costs of 0.25×, 1× and 3× the profile's.

Issue 24's idle-drafter modes: every policy runs on the ``stock`` tax (vLLM's own behaviour); the controller and
k = 0 run again on the ``plugin`` term (``fleet.perf.IdleDrafterMode``, ``Profile.with_idle_drafter``), named
``gearshift@plugin`` and ``k=0@plugin``.

Issue 13's baselines come last (``bench.policy.placement``): ``best-uniform-static`` is the best static k's run
under that name; on every mixed-tier scenario with two or more workers the best static placement is searched in
hindsight (``best-static-placement``: the better of the search's best measured run and the best uniform static
k; elsewhere the best uniform static k), and on single-phase mixed-tier scenarios of four or more workers the
knee (``placement.knee_rate``, cached with the capacities) is measured around the phase's rate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources

from bench.executor import Executor, LocalPool
from bench.policy import load, placement, references
from bench.policy.capacity import MixPoint, best_k, max_batch, throughput
from bench.policy.fleet_plan_lab import FleetPlanPolicy
from bench.policy.lab import mix_point, run_policy
from bench.policy.policies import LAB_POLICIES, ControllerPolicy, LabPolicy, PhaseOracle, StaticSchedule
from bench.policy.run_metrics import RunMetrics, summarise
from bench.policy.scenario import Scenario
from fleet.fallback import tuned_table
from fleet.perf import IdleDrafterMode, Profile, load_profile

BASE_KS: tuple[int, ...] = (0, 1, 2, 4)
"""Static k run on every profile, besides its k_max."""
GATE_MIN_GAIN = 0.10
CONTROLLER = "gearshift"
ORACLE = "oracle"
"""The composite reference (``bench.policy.references``): per phase the best of static k, table and no-drafter."""
ORACLE_K = "oracle-k"
"""The run of the per-phase best static k (``PhaseOracle``)."""
BEST_FLEET_PLAN = "best-fleet-plan"
TABLE = "vllm-table"
ADAPTIVE = "adaptive"
CONTROLLER_ADAPTIVE = "gearshift+adaptive"
PLUGIN_SUFFIX = "@plugin"
PLUGIN_CONTROLLER = CONTROLLER + PLUGIN_SUFFIX
PLUGIN_K0 = "k=0" + PLUGIN_SUFFIX
OPERATOR = ("best-uniform-static", TABLE, "no-drafter")
"""What an operator already has without gearshift (issue 25): the best of these is the bar."""
NO_DRAFTER = "no-drafter"
BEST_UNIFORM = "best-uniform-static"
BEST_PLACEMENT = "best-static-placement"
FLEET_PLAN = "fleet-plan"
"""The fleet plan: the real controller's joint planner, forecast and drafter-free moves
(``bench.policy.fleet_plan_lab``)."""


def static_name(k: int) -> str:
    return f"k={k}"


def family_profiles() -> list[str]:
    """The names of the profiles of the family: every built-in profile (``fleet/profiles/*.yaml``)."""
    return sorted(
        p.name.removesuffix(".yaml") for p in resources.files("fleet.profiles").iterdir() if p.name.endswith(".yaml")
    )


def static_ks(profile: Profile) -> tuple[int, ...]:
    """The static k of a profile's suite: ``BASE_KS`` and its k_max (the recipe default)."""
    return tuple(sorted({*(k for k in BASE_KS if k < profile.drafter.k_max), profile.drafter.k_max}))


def scenario_mix(scenario: Scenario) -> MixPoint:
    """The duration-weighted mean request shape over all phases."""
    points = [(mix_point(p), p.duration_s) for p in scenario.phases]
    total = sum(d for _, d in points)
    workloads: dict[str, float] = {}
    for point, d in points:
        weight_sum = sum(w for _, w in point.workloads)
        for name, w in point.workloads:
            workloads[name] = workloads.get(name, 0.0) + w / weight_sum * d / total
    return MixPoint(
        workloads=tuple(workloads.items()),
        prompt_tokens=sum(p.prompt_tokens * d for p, d in points) / total,
        output_tokens=sum(p.output_tokens * d for p, d in points) / total,
    )


def vllm_table(profile: Profile, scenario: Scenario) -> StaticSchedule:
    """The best static k per batch-size band, adjacent equal bands merged (vLLM's table format;
    ``fleet.fallback.tuned_table``, the tuner the worker's start-up table uses too)."""
    return StaticSchedule(TABLE, tuned_table(profile, scenario_mix(scenario), scenario.seqs))


def threshold_gate(profile: Profile, scenario: Scenario) -> StaticSchedule:
    """k_on below the threshold batch, 0 from it on."""
    mix = scenario_mix(scenario)
    top = scenario.seqs
    k_on = best_k(profile, mix, 1)
    threshold = top + 1
    for batch in range(1, max_batch(profile, mix, top) + 1):
        gain = throughput(profile, mix, batch, best_k(profile, mix, batch))[0] / throughput(profile, mix, batch, 0)[0]
        if gain < 1.0 + GATE_MIN_GAIN:
            threshold = batch
            break
    if threshold > top:
        return StaticSchedule("gate", ((1, top, k_on),))
    if threshold == 1:
        return StaticSchedule("gate", ((1, top, 0),))
    return StaticSchedule("gate", ((1, threshold - 1, k_on), (threshold, top, 0)))


def baseline_policies(profile: Profile, scenario: Scenario) -> list[LabPolicy]:
    out: list[LabPolicy] = [StaticSchedule.plain(k) for k in static_ks(profile)]
    out += [vllm_table(profile, scenario), threshold_gate(profile, scenario)]
    out.append(StaticSchedule(NO_DRAFTER, ((1, 1_000_000, 0),), drafter=False))
    return out + [make() for make in LAB_POLICIES.values()] + [FleetPlanPolicy()]


def oracle_ks(scenario: Scenario, statics: Sequence[RunMetrics]) -> dict[str, int]:
    """Per phase, the static k whose run had the highest goodput in that phase (ties: the smaller k)."""
    out: dict[str, int] = {}
    for phase in scenario.phases:
        best = max(
            statics,
            key=lambda m: (next(p.goodput_tok_s for p in m.phases if p.name == phase.name), -int(m.policy[2:])),
        )
        out[phase.name] = int(best.policy[2:])
    return out


def plugin_policies(profile: Profile) -> list[LabPolicy]:
    """The policies run again on the plugin's idle-drafter term (named ``…@plugin``)."""
    view = profile.with_idle_drafter(IdleDrafterMode.PLUGIN)
    k0 = StaticSchedule(PLUGIN_K0, ((1, 1_000_000, 0),))
    return [k0, ControllerPolicy(name=PLUGIN_CONTROLLER, believed=view)]


def _run_one(scenario: Scenario, policy: LabPolicy) -> RunMetrics:
    profile = load_profile(scenario.profile)
    if policy.name.endswith(PLUGIN_SUFFIX):
        profile = profile.with_idle_drafter(IdleDrafterMode.PLUGIN)
    return summarise(run_policy(scenario, policy, profile=profile), profile)


def _capacity(scenario: Scenario, phase_name: str) -> load.Capacity:
    phase = next(p for p in scenario.phases if p.name == phase_name)
    return load.capacity_for(scenario, phase, load_profile(scenario.profile))


@dataclass
class SuiteResult:
    """One profile's runs."""

    scenarios: list[Scenario]
    """Bound to the profile, loads resolved."""
    profile: str = ""
    static_ks: tuple[int, ...] = (0, 1, 2, 4, 7)
    runs: dict[tuple[str, str], RunMetrics] = field(default_factory=dict)
    """(scenario, policy) → metrics."""
    oracle_choice: dict[str, dict[str, int]] = field(default_factory=dict)
    baselines: dict[str, dict[str, str]] = field(default_factory=dict)
    """scenario → policy name → its table, for the report."""
    capacities: dict[str, dict[str, load.Capacity]] = field(default_factory=dict)
    """scenario → phase → the measured capacity its ``load`` refers to."""
    skipped: list[str] = field(default_factory=list)
    """Scenarios not meaningful on this profile (``Scenario.fits``)."""
    ceilings: dict[str, placement.Ceiling] = field(default_factory=dict)
    """scenario → the best static placement the hindsight search found (mixed-tier scenarios)."""
    knees: dict[str, float] = field(default_factory=dict)
    """scenario → the measured knee, requests/s (single-phase mixed-tier scenarios of ≥ 4 workers)."""
    refs: dict[tuple[str, str, float], references.Reference] = field(default_factory=dict)
    """(scenario, reference name, restart scale) → the hindsight plan (``bench.policy.references``)."""
    restart_s: float = 0.0
    """The profile's ``serving.restart_s`` (the 1× of the references' restart costs)."""

    def reference(self, scenario: str, name: str, scale: float = 1.0) -> references.Reference:
        return self.refs[scenario, name, scale]

    @property
    def recipe(self) -> str:
        """The recipe default's policy name (static k = the profile's k_max)."""
        return static_name(self.static_ks[-1])

    def policies(self) -> list[str]:
        seen: list[str] = []
        for _, p in self.runs:
            if p not in seen:
                seen.append(p)
        order = [static_name(k) for k in self.static_ks]
        order += [
            TABLE,
            "gate",
            NO_DRAFTER,
            *LAB_POLICIES,
            FLEET_PLAN,
            PLUGIN_K0,
            PLUGIN_CONTROLLER,
            ORACLE_K,
            BEST_UNIFORM,
        ]
        order += [BEST_PLACEMENT]
        return sorted(seen, key=lambda p: order.index(p) if p in order else len(order))


Progress = Callable[[str], None]


def run_family(
    profiles: Sequence[Profile],
    scenarios: Sequence[Scenario],
    *,
    processes: int | None = None,
    progress: Progress = lambda _: None,
    capacity_cache: load.CapacityCache | None = None,
    executor: Executor | None = None,
) -> dict[str, SuiteResult]:
    """Run every policy on every scenario meaningful on each profile (on ``executor``, by default ``processes``
    worker processes; 1 runs in this process). Capacities found in ``capacity_cache`` are not measured again; new
    ones are added to it (and saved). Returns profile name → its result."""
    pool = executor or LocalPool(processes)
    results: dict[str, SuiteResult] = {}
    bound: list[Scenario] = []
    for profile in profiles:
        result = SuiteResult(
            [], profile=profile.name, static_ks=static_ks(profile), restart_s=profile.serving.restart_s or 0.0
        )
        for sc in scenarios:
            if sc.fits(profile):
                bound.append(sc.on(profile))
            else:
                result.skipped.append(sc.name)
        results[profile.name] = result
    wanted: dict[str, tuple[Scenario, str]] = {}
    for sc in bound:
        for phase in load.load_phases(sc):
            wanted.setdefault(load.mix_key(sc, phase), (sc, phase.name))
    by_key: dict[str, load.Capacity] = {}
    if capacity_cache is not None:
        for key, (sc, _) in wanted.items():
            hit = capacity_cache.get(key, load_profile(sc.profile))
            if hit is not None:
                by_key[key] = hit
    missing = [key for key in wanted if key not in by_key]
    measured = _map(_capacity, [wanted[k] for k in missing], pool, lambda a: progress(f"capacity {a[0].name}"))
    by_key.update(zip(missing, measured, strict=True))
    if capacity_cache is not None and missing:
        for key in missing:
            capacity_cache.put(key, load_profile(wanted[key][0].profile), by_key[key])
        capacity_cache.save()
    first: list[tuple[Scenario, LabPolicy]] = []
    for raw_sc in bound:
        result = results[raw_sc.profile]
        sc = load.resolve(raw_sc, by_key)
        result.scenarios.append(sc)
        result.capacities[sc.name] = {p.name: by_key[load.mix_key(raw_sc, p)] for p in load.load_phases(raw_sc)}
        policies = baseline_policies(load_profile(sc.profile), sc) + plugin_policies(load_profile(sc.profile))
        result.baselines[sc.name] = {
            p.name: str([list(r) for r in p.rows]) for p in policies if isinstance(p, StaticSchedule)
        }
        first += [(sc, p) for p in policies]
    _execute(first, results, pool, progress)
    second: list[tuple[Scenario, LabPolicy]] = []
    for result in results.values():
        for sc in result.scenarios:
            statics = [result.runs[sc.name, static_name(k)] for k in result.static_ks]
            choice = oracle_ks(sc, statics)
            result.oracle_choice[sc.name] = choice
            second.append((sc, PhaseOracle(ORACLE_K, choice)))
    _execute(second, results, pool, progress)
    _placement_stage(results, pool, progress, capacity_cache)
    for result in results.values():
        compose_references(result)
    return results


def compose_references(result: SuiteResult) -> None:
    """``oracle`` and ``best-fleet-plan`` for every scenario at every restart scale (module docstring)."""
    oracle_over = [*(static_name(k) for k in result.static_ks), TABLE, NO_DRAFTER]
    fleet_over = [*oracle_over, BEST_PLACEMENT]
    for sc in result.scenarios:
        for scale in references.RESTART_SCALES:
            restart_s = result.restart_s * scale
            for name, over in ((ORACLE, oracle_over), (BEST_FLEET_PLAN, fleet_over)):
                runs = [result.runs[sc.name, p] for p in over if (sc.name, p) in result.runs]
                result.refs[sc.name, name, scale] = references.best_plan(name, runs, restart_s=restart_s)


def _knee_key(sc: Scenario) -> str:
    return "knee:" + load.mix_key(sc, sc.phases[0]) + f":{placement.poisson_rate_of(sc.phases[0])}"


def _knee(sc: Scenario) -> float:
    return placement.knee_rate(
        sc, sc.phases[0], placement.poisson_rate_of(sc.phases[0]), static_ks(load_profile(sc.profile))
    )


def _placement_job(kind: str, sc: Scenario) -> placement.Ceiling | float:
    return placement.best_static_placement(sc, name=BEST_PLACEMENT) if kind == "ceiling" else _knee(sc)


def _placement_stage(
    results: dict[str, SuiteResult], pool: Executor, progress: Progress, cache: load.CapacityCache | None
) -> None:
    """Issue 13's baselines (module docstring): the searches and knee probes in parallel, then the named runs."""
    searched = [(r, sc) for r in results.values() for sc in r.scenarios if placement.searchable(sc)]
    kneed: list[tuple[SuiteResult, Scenario]] = []
    for r in results.values():
        for sc in r.scenarios:
            if not placement.has_knee(sc):
                continue
            hit = cache.get(_knee_key(sc), load_profile(sc.profile)) if cache is not None else None
            if hit is None:
                kneed.append((r, sc))
            else:
                r.knees[sc.name] = hit.rate_per_s
    jobs = [("ceiling", sc) for _, sc in searched] + [("knee", sc) for _, sc in kneed]
    owners = [r for r, _ in searched] + [r for r, _ in kneed]
    for r, (_, sc), found in zip(owners, jobs, pool.map(_placement_job, jobs), strict=True):
        if isinstance(found, placement.Ceiling):
            r.ceilings[sc.name] = found
            progress(f"{sc.profile} · {sc.name} · {BEST_PLACEMENT} search")
            continue
        r.knees[sc.name] = found
        if cache is not None:
            rate = placement.poisson_rate_of(sc.phases[0])
            cache.put(_knee_key(sc), load_profile(sc.profile), load.Capacity(found, -1, rate, 0))
        progress(f"{sc.profile} · {sc.name} · knee")
    if cache is not None and kneed:
        cache.save()
    for r in results.values():
        for sc in r.scenarios:
            best = max((r.runs[sc.name, static_name(k)] for k in r.static_ks), key=lambda m: m.goodput_tok_s)
            r.runs[sc.name, BEST_UNIFORM] = dataclasses.replace(best, policy=BEST_UNIFORM)
            ceiling = r.ceilings.get(sc.name)
            top = ceiling.metrics if ceiling and ceiling.metrics.goodput_tok_s > best.goodput_tok_s else best
            r.runs[sc.name, BEST_PLACEMENT] = dataclasses.replace(top, policy=BEST_PLACEMENT)


def run_suite(
    scenarios: Sequence[Scenario], *, processes: int | None = None, progress: Progress = lambda _: None
) -> SuiteResult:
    """``run_family`` on the one profile the scenarios name (their ``profile``)."""
    names = {sc.profile for sc in scenarios}
    if len(names) != 1:
        raise ValueError(f"run_suite: the scenarios name {sorted(names)}; use run_family for several profiles")
    (name,) = names
    return run_family([load_profile(name)], scenarios, processes=processes, progress=progress)[name]


def _map(fn: Callable[[Scenario, str], load.Capacity], args: list[tuple[Scenario, str]], pool: Executor,
         done: Callable[[tuple[Scenario, str]], None]) -> list[load.Capacity]:  # fmt: skip
    out = []
    for a, capacity in zip(args, pool.map(fn, args), strict=True):
        out.append(capacity)
        done(a)
    return out


def _execute(
    jobs: list[tuple[Scenario, LabPolicy]], results: dict[str, SuiteResult], pool: Executor, progress: Progress
) -> None:
    for (sc, policy), metrics in zip(jobs, pool.map(_run_one, jobs), strict=True):
        results[sc.profile].runs[sc.name, policy.name] = metrics
        progress(f"{sc.profile} · {sc.name} · {policy.name}")
