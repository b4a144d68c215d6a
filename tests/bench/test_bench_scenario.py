"""Scenario files: the built-in set loads, and a bad file fails with a message naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.policy.scenario import load_scenario, load_scenarios
from fleet.config import ConfigError
from workers.sim.arrivals import Lengths

BUILT_IN = {
    "bursts",
    "concurrency-sweep",
    "long-context-mix",
    "mixed-tiers",
    "phase-shift",
    "poisson-load",
    "step-load",
    "straddle",
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
