"""The policy report can be regenerated a piece at a time (``bench.policy.pieces``): a run of one profile and
scenario replaces that piece and keeps every other, and the report is written from all of them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench.policy import pieces
from bench.policy.scenario import Scenario
from bench.policy.suite import SuiteResult


def _scenario(name: str) -> Scenario:
    chat = [{"workload": "chat", "output_tokens": {"mean": 50}, "prompt_tokens": {"mean": 200}}]
    phase = {"name": "one", "duration_s": 6, "arrival": {"kind": "closed", "concurrency": 4}, "mix": chat}
    return Scenario.model_validate({"name": name, "description": name, "workers": 1, "phases": [phase]})


def _result(
    profile: str, figures: dict[str, str], *, skipped: tuple[str, ...] = (), ks: tuple[int, ...] = (0, 7)
) -> SuiteResult:
    """A result whose every per-scenario field holds ``figures[scenario]`` (a stand-in for the metrics)."""
    r = SuiteResult([_scenario(n) for n in figures], profile=profile, static_ks=ks, restart_s=600.0)
    r.skipped = list(skipped)
    for name, fig in figures.items():
        r.runs[name, "gearshift"] = r.runs[name, "k=0"] = fig  # type: ignore[assignment]
        r.oracle_choice[name] = {"one": len(fig)}
        r.baselines[name] = {"vllm-table": fig}
        r.capacities[name] = {"one": fig}  # type: ignore[dict-item]
        r.ceilings[name] = fig  # type: ignore[assignment]
        r.knees[name] = float(len(fig))
        r.refs[name, "oracle", 1.0] = fig  # type: ignore[assignment]
    return r


def _figures(r: SuiteResult, scenario: str) -> set[object]:
    return {
        r.runs[scenario, "gearshift"], r.runs[scenario, "k=0"], r.baselines[scenario]["vllm-table"],
        r.capacities[scenario]["one"], r.ceilings[scenario], r.refs[scenario, "oracle", 1.0],
    }  # fmt: skip


def test_every_field_of_a_suite_result_is_split_and_merged() -> None:
    """A field added to ``SuiteResult`` must be placed in one of the piece's groups, or pieces would drop it."""
    handled = {"scenarios", "skipped", *pieces.PER_SCENARIO, *pieces.PER_PROFILE}
    assert {f.name for f in dataclasses.fields(SuiteResult)} == handled


def test_a_piece_replaces_its_scenario_and_keeps_the_others(tmp_path: Path) -> None:
    pieces.store({"p": _result("p", {"b-scenario": "old-b", "a-scenario": "old-a"}, skipped=("gone",))}, tmp_path)
    pieces.store({"q": _result("q", {"a-scenario": "q-a"})}, tmp_path)
    merged = pieces.store({"p": _result("p", {"b-scenario": "new-b"})}, tmp_path)
    assert list(merged) == ["p", "q"]
    p = merged["p"]
    assert [sc.name for sc in p.scenarios] == ["a-scenario", "b-scenario"]
    assert _figures(p, "a-scenario") == {"old-a"}
    assert _figures(p, "b-scenario") == {"new-b"}
    assert p.oracle_choice == {"a-scenario": {"one": 5}, "b-scenario": {"one": 5}}
    assert p.knees == {"a-scenario": 5.0, "b-scenario": 5.0}
    assert p.skipped == ["gone"]
    assert (p.profile, p.static_ks, p.restart_s) == ("p", (0, 7), 600.0)
    assert _figures(merged["q"], "a-scenario") == {"q-a"}


def test_pieces_that_disagree_on_the_profile_are_refused(tmp_path: Path) -> None:
    pieces.store({"p": _result("p", {"a": "x"})}, tmp_path)
    with pytest.raises(pieces.PieceError, match="static_ks"):
        pieces.store({"p": _result("p", {"b": "y"}, ks=(0, 4))}, tmp_path)


def test_a_piece_that_does_not_load_is_named(tmp_path: Path) -> None:
    pieces.store({"p": _result("p", {"a": "x"})}, tmp_path)
    bad = tmp_path / pieces.PIECES / "p" / "b.pickle"
    bad.write_bytes(b"not a pickle")
    with pytest.raises(pieces.PieceError, match=r"b\.pickle"):
        pieces.load(tmp_path)
