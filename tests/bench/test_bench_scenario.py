"""Scenario files: the built-in set loads, and a bad file fails with a message naming the field."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from bench.policy import load
from bench.policy.lab import run_policy
from bench.policy.placement import is_mixed_tier
from bench.policy.policies import StaticSchedule
from bench.policy.scenario import load_scenario, load_scenarios
from fleet.config import ConfigError, SpeculationMode
from fleet.perf import load_profile
from workers.sim.arrivals import Lengths

BUILT_IN = {
    "agentic-bursts-4w",
    "agentic-coding",
    "bursts",
    "concurrency-sweep",
    "long-context-mix",
    "mixed-tiers",
    "placement-knee-mi355x",
    "placement-knee-tp16",
    "plan-steady-batch",
    "plan-surge",
    "placement-surge-mi355x",
    "placement-surge-tp16",
    "phase-shift",
    "prompt-bursts-mixed",
    "poisson-load",
    "random-sweep-mi355x",
    "step-load",
    "straddle",
    "swing-maths-mi355x",
}


def test_built_in_scenarios_load_and_cover_the_issue() -> None:
    scenarios = {s.name: s for s in load_scenarios()}
    assert set(scenarios) == BUILT_IN
    sweep = [p.arrival for p in scenarios["concurrency-sweep"].phases]
    assert [a.concurrency for a in sweep if a.kind == "closed"] == [1, 2, 4, 8, 16, 32, 64, 128]
    loads = [p.arrival.load or 0.0 for p in scenarios["poisson-load"].phases if p.arrival.kind == "poisson"]
    assert min(loads) == pytest.approx(0.3)
    assert max(loads) == pytest.approx(1.2)
    assert [p.mix[0].workload for p in scenarios["phase-shift"].phases] == ["maths", "chat", "code"]
    tiers = {c.tier for p in scenarios["mixed-tiers"].phases for c in p.mix}
    assert tiers == {"interactive", "batch"}
    assert scenarios["mixed-tiers"].tiers["interactive"].tpot_target_s is not None
    assert scenarios["mixed-tiers"].tiers["batch"].tpot_target_s is None
    for name in ("agentic-coding", "agentic-bursts-4w", "prompt-bursts-mixed"):  # long-prompt bursts (issue 12)
        (phase,) = scenarios[name].phases
        assert phase.arrival.kind == "burst", name
        assert max(c.prompt_tokens.mean for c in phase.mix) >= 8192, name
    for name in ("placement-knee-tp16", "placement-knee-mi355x", "placement-surge-tp16", "placement-surge-mi355x"):
        sc = scenarios[name]  # issue 13: mixed tiers on at least 4 workers, one profile each (absolute rates)
        assert sc.workers >= 4, name
        assert is_mixed_tier(sc), name
        assert sc.profiles is not None, name
        assert len(sc.profiles) == 1, name
    surge = scenarios["plan-surge"]  # issue 25: the load triples in one step, far faster than any restart
    rates = [p.arrival.load for p in surge.phases if p.arrival.kind == "poisson"]
    assert rates[0] is not None
    assert rates[1] is not None
    assert rates[1] == pytest.approx(3 * rates[0])
    assert scenarios["plan-steady-batch"].plan_gain
    assert is_mixed_tier(scenarios["plan-steady-batch"])
    for name in ("plan-surge", "plan-steady-batch"):
        assert set(scenarios[name].profiles or ()) == {"kimi-k3-dspark-tp16", "kimi-k3-dspark-mi355x-tp8"}, name


def _write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(body)
    return path


PHASE = "phases: [{name: p, duration_s: 10, arrival: {kind: closed, concurrency: 2}, mix: [{workload: chat}]}]"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (
            "name: bad\ndescription: x\n"
            "phases: [{name: p, duration_s: 10, arrival: {kind: closed, concurrency: 2}, mix: [{tier: gold}]}]",
            "phases[0].mix[0].tier: unknown tier 'gold'",
        ),
        (
            "name: bad\ndescription: x\n"
            "phases: [{name: p, duration_s: 10, arrival: {kind: poisson, load: 0.5, rate_per_s: 2}, mix: [{}]}]",
            "phases[0].arrival.poisson",
        ),
        ("name: bad\ndescription: x\nworkers: 0\n" + PHASE, "workers"),
        ("name: bad\ndescription: x\nwarmup_s: 10\n" + PHASE, "warmup_s"),
        ("name: bad\ndescription: x\nphases: []\n", "phases"),
        (
            "name: bad\ndescription: x\n"
            "phases: [{name: p, duration_s: 10, arrival: {kind: closed, concurrency: 2},"
            " mix: [{prompt_tokens: {mean: 10, spread: 2}}]}]",
            "phases[0].mix[0].prompt_tokens: Value error, unknown field(s) ['spread']",
        ),
        (
            "name: bad\ndescription: x\n"
            "phases: [{name: p, duration_s: 10, arrival: {kind: closed, concurrency: 2},"
            " mix: [{output_tokens: {mean: 10, min: 20, max: 5}}]}]",
            "phases[0].mix[0].output_tokens",
        ),
    ],
)
def test_bad_scenario_names_the_field(tmp_path: Path, body: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_scenario(_write(tmp_path, "bad", body))
    assert fragment in str(err.value)
    assert "bad.yaml" in str(err.value)


def test_scenario_name_must_match_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="name: 'other' must match the file name 'bad'"):
        load_scenario(_write(tmp_path, "bad", "name: other\ndescription: x\n" + PHASE))


def test_unknown_scenario_is_named(tmp_path: Path) -> None:
    _write(tmp_path, "one", "name: one\ndescription: x\n" + PHASE)
    with pytest.raises(ConfigError, match=r"unknown \['two'\]"):
        load_scenarios(tmp_path, ["two"])


def test_scaled_keeps_structure() -> None:
    sc = load_scenarios(names=["step-load"])[0]
    small = sc.scaled(0.1)
    assert small.duration_s == pytest.approx(sc.duration_s * 0.1)
    assert [p.name for p in small.phases] == [p.name for p in sc.phases]
    assert small.phase_at(small.phases[0].duration_s + 0.001).name == sc.phases[1].name


def test_scenario_lengths_are_the_simulators_with_the_scenario_defaults(tmp_path: Path) -> None:
    """One ``Lengths`` class: a scenario file's length is the simulator's, with sigma 0.5 where left out."""
    body = (
        "name: lengths\ndescription: x\n"
        "phases: [{name: p, duration_s: 10, arrival: {kind: closed, concurrency: 2},"
        " mix: [{prompt_tokens: {mean: 300}, output_tokens: {mean: 50, sigma: 0}}]}]"
    )
    cls = load_scenario(_write(tmp_path, "lengths", body)).phases[0].mix[0]
    assert isinstance(cls.prompt_tokens, Lengths)
    assert (cls.prompt_tokens.sigma, cls.prompt_tokens.max) == (0.5, 1_000_000)
    assert cls.output_tokens == Lengths(mean=50, sigma=0, max=1_000_000)


TP16, MI355X = load_profile("kimi-k3-dspark-tp16"), load_profile("kimi-k3-dspark-mi355x-tp8")


def test_scenarios_state_the_profiles_they_fit() -> None:
    scenarios = {s.name: s for s in load_scenarios()}
    sweep, long_context = scenarios["random-sweep-mi355x"], scenarios["long-context-mix"]
    assert sweep.fits(MI355X)
    assert not sweep.fits(TP16), "named for the MI355X profile only"
    assert long_context.fits(TP16)
    assert long_context.context_tokens > MI355X.hardware.kv_capacity_tokens
    assert not long_context.fits(MI355X), "400k-token prompts do not fit the MI355X recipe's KV cache"
    assert [p.arrival.concurrency for p in sweep.phases if p.arrival.kind == "closed"] == [
        1, 2, 4, 8, 16, 32, 64, 32, 16, 8, 4, 2, 1
    ]  # fmt: skip
    agentic = scenarios["agentic-coding"]
    assert agentic.workers == 2
    assert {c.prompt_tokens.mean for p in agentic.phases for c in p.mix} == {8192}
    assert all(p.arrival.kind == "burst" for p in agentic.phases)


def test_a_bound_scenario_takes_the_recipes_batch_limit_and_gpus() -> None:
    sc = load_scenarios(names=["phase-shift"])[0]
    with pytest.raises(ValueError, match="bind the scenario"):
        _ = sc.seqs
    bound = sc.on(MI355X)
    assert (bound.profile, bound.seqs, bound.gpus) == (MI355X.name, 128, 8)
    straddle = load_scenarios(names=["straddle"])[0].on(TP16)
    assert straddle.seqs == 512, "a scenario's own max_num_seqs wins"


def test_load_is_resolved_against_the_measured_capacity() -> None:
    sc = load_scenarios(names=["poisson-load"])[0].on(TP16)
    with pytest.raises(ValueError, match="unresolved"):
        run_policy(sc, StaticSchedule.plain(0), profile=TP16)
    keys = {load.mix_key(sc, p) for p in load.load_phases(sc)}
    assert len(keys) == 1, "the four phases share one mix: one capacity search"
    resolved = load.resolve(sc, {keys.pop(): load.Capacity(10.0, 4, 12.0, 9)})
    rates = [p.arrival.rate_per_s for p in resolved.phases if p.arrival.kind == "poisson"]
    assert rates == [pytest.approx(3.0), pytest.approx(6.0), pytest.approx(9.0), pytest.approx(12.0)]


def test_a_capacity_probe_passes_below_capacity_and_fails_far_above_it() -> None:
    sc = load_scenarios(names=["mixed-tiers"])[0].on(TP16)
    mix = sc.phases[0].mix
    assert load.passes(sc, mix, 0.5, 4, TP16)
    assert not load.passes(sc, mix, 60.0, 4, TP16), "an overloaded fleet misses the SLA or grows a backlog"


def test_the_day_long_plan_scenario_outlasts_ten_restarts_on_each_profile_it_names() -> None:
    """Issue 25: every stretch of the compressed day is longer than 10 × the profile's restart_s, and its load
    crosses the crossover (a full batch per worker in the day, an eighth of one at night)."""
    (day,) = load_scenarios(Path(str(resources.files("bench.policy"))) / "plan_scenarios", ["plan-day"])
    assert day.plan_gain
    for name in day.profiles or ():
        profile = load_profile(name)
        assert profile.serving.restart_s is not None, name
        assert min(p.duration_s for p in day.phases) > 10 * profile.serving.restart_s, name
        streams = [p.arrival.concurrency for p in day.phases if p.arrival.kind == "closed"]
        assert max(streams) >= day.workers * profile.serving.max_num_seqs > min(streams), name


def test_the_off_traffic_scenario_sends_a_fifth_of_its_requests_with_speculation_off() -> None:
    (off,) = load_scenarios(Path(str(resources.files("bench.policy"))) / "plan_scenarios", ["plan-off-traffic"])
    weights = {c.tier: c.weight for p in off.phases for c in p.mix}
    assert off.tiers["no-spec"].speculation is SpeculationMode.OFF
    assert weights["no-spec"] / sum(weights.values()) == pytest.approx(0.2)
    assert set(off.profiles or ()) == {"kimi-k3-dspark-tp16", "kimi-k3-dspark-mi355x-tp8"}
