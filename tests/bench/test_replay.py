"""What-if replay (issue 17): trace formats, rebasing, sessions, and a replay whose lab requests match the trace."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench.policy.lab import run_policy
from bench.policy.policies import StaticSchedule
from bench.replay.acceptance import closest_class, tenant_classes
from bench.replay.fingerprint import count_fields, differences, fingerprint
from bench.replay.load import think_times
from bench.replay.report import verdict, write
from bench.replay.run import replay, run_one
from bench.replay.scenario import plan_replay
from bench.replay.speed import measure, synthetic_trace
from bench.replay.trace import TraceError, TraceRequest, detect, read_trace, rebase
from fleet.config import ConfigError
from fleet.perf import conditional_acceptance, expected_tokens_per_step, load_profile
from fleet.store.protocol import WorkerState
from gearshift.cli.app import app

PROFILE = "kimi-k3-dspark-tp16"


def _jsonl(path: Path, rows: Sequence[Mapping[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_formats_are_detected_from_their_fields(tmp_path: Path) -> None:
    azure = tmp_path / "azure.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n")
    burst = tmp_path / "burst.csv"
    burst.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,x\n")
    plain_csv = tmp_path / "plain.csv"
    plain_csv.write_text("arrival_s,prompt_tokens,output_tokens\n0.5,10,3\n")
    ledger = _jsonl(tmp_path / "ledger.jsonl", [{"request_id": "r", "completion_tokens": 3, "prompt_tokens": 1}])
    mooncake = _jsonl(tmp_path / "mc.jsonl", [{"timestamp": 27, "input_length": 9, "output_length": 2}])
    plain_json = _jsonl(tmp_path / "plain.jsonl", [{"arrival_s": 1, "prompt_tokens": 2, "output_tokens": 3}])
    found = [detect(p) for p in (azure, burst, plain_csv, ledger, mooncake, plain_json)]
    assert found == ["azure", "burstgpt", "plain", "ledger", "mooncake", "plain"]


def test_each_format_reads_arrivals_and_lengths(tmp_path: Path) -> None:
    azure = tmp_path / "azure.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.1805900,100,7\n"
    )
    trace = read_trace(azure)
    assert [(round(r.arrival_s, 3), r.prompt_tokens, r.output_tokens) for r in trace.requests] == [
        (0.0, 374, 44),
        (3.5, 100, 7),
    ]
    mooncake = _jsonl(
        tmp_path / "mc.jsonl",
        [
            {"timestamp": 1000, "input_length": 9, "output_length": 2},
            {"timestamp": 3500, "input_length": 5, "output_length": 1},
        ],
    )
    assert [r.arrival_s for r in read_trace(mooncake).requests] == [0.0, 2.5]
    ledger = _jsonl(
        tmp_path / "ledger.jsonl",
        [
            {"request_id": "a", "tenant": "acme", "tier": "interactive", "workload": "code", "prompt_tokens": 10,
             "completion_tokens": 5, "arrived_at": 100.0, "at": 101.0, "worker_id": "w0", "session": "s1"},
            {"request_id": "b", "tenant": "acme", "prompt_tokens": 10, "completion_tokens": 0, "arrived_at": 100.5},
        ],
    )  # fmt: skip
    trace = read_trace(ledger)
    assert trace.left_out == 1, "a record without output tokens (a refused request) is left out and counted"
    (only,) = trace.requests
    assert (only.tenant, only.tier, only.workload, only.session, only.worker_id) == (
        "acme", "interactive", "code", "s1", "w0",
    )  # fmt: skip
    assert only.finish_s == 1.0


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"arrival_s": "soon", "prompt_tokens": 1, "output_tokens": 1}, "arrival_s"),
        ({"arrival_s": 1, "prompt_tokens": -3, "output_tokens": 1}, "prompt_tokens"),
        ({"arrival_s": 1, "prompt_tokens": 1}, "output_tokens"),
        ({"arrival_s": 1, "prompt_tokens": 1.5, "output_tokens": 1}, "prompt_tokens"),
    ],
)
def test_a_bad_row_names_the_file_the_line_and_the_field(tmp_path: Path, row: dict[str, object], field: str) -> None:
    good = {"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}
    path = _jsonl(tmp_path / "t.jsonl", [good, good, row])
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert f"{path}:3: {field}:" in str(err.value)


def test_csv_bad_row_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("timestamp,input_tokens,completion_tokens\n1,2,3\n2,x,3\n")
    with pytest.raises(TraceError, match=rf"{path}:3: input_tokens: not a number"):
        read_trace(path)


def test_rebase_sorts_speeds_up_and_cuts() -> None:
    reqs = [TraceRequest(arrival_s=t, prompt_tokens=1, output_tokens=1, finish_s=t + 1) for t in (110, 100, 130, 190)]
    trace = rebase(reqs, source="x", speed=2.0, max_duration_s=40.0)
    assert [r.arrival_s for r in trace.requests] == [0.0, 5.0, 15.0]
    assert [r.finish_s for r in trace.requests] == [0.5, 5.5, 15.5]
    assert trace.cut == 1
    with pytest.raises(TraceError, match="speed"):
        read_trace(Path("/nonexistent"), speed=0)


def test_think_time_is_the_gap_from_the_previous_finish() -> None:
    turns = [
        TraceRequest(arrival_s=0.0, prompt_tokens=1, output_tokens=1, finish_s=3.0),
        TraceRequest(arrival_s=5.0, prompt_tokens=1, output_tokens=1, finish_s=None),
        TraceRequest(arrival_s=6.0, prompt_tokens=1, output_tokens=1),
    ]
    assert think_times(turns) == [0.0, 2.0, 0.0]


def _known_trace(n: int = 40) -> list[TraceRequest]:
    return [
        TraceRequest(
            arrival_s=1000.0 + 1.7 * i,
            prompt_tokens=100 + 37 * i,
            output_tokens=5 + (i * 7) % 40,
            tenant="acme" if i % 2 else "bulk",
            tier="interactive" if i % 2 else "batch",
            workload="code" if i % 3 else "maths",
        )
        for i in range(n)
    ]


def test_the_labs_requests_match_the_trace_exactly() -> None:
    profile = load_profile(PROFILE)
    trace = rebase(_known_trace(), source="known")
    plan = plan_replay(trace, profile, profile_path=PROFILE, workers=2, phase_s=30.0)
    raw = run_policy(plan.scenario, StaticSchedule.plain(3), profile=profile, load=plan.load(), priced=False)
    got = sorted(raw.records.requests, key=lambda r: r.arrival_s)
    assert len(got) == len(trace.requests)
    for record, want in zip(got, trace.requests, strict=True):
        assert math.isclose(record.arrival_s, want.arrival_s, abs_tol=1e-9)
        assert (record.prompt_tokens, record.max_tokens, record.workload, record.tag) == (
            want.prompt_tokens, want.output_tokens, want.workload, want.tier,
        )  # fmt: skip
        assert record.finished
        assert record.output_tokens == want.output_tokens


def test_sessions_wait_for_the_previous_answer() -> None:
    profile = load_profile(PROFILE)
    turns = [
        TraceRequest(arrival_s=0.0, prompt_tokens=500, output_tokens=60, session="s", finish_s=0.1),
        TraceRequest(arrival_s=0.6, prompt_tokens=900, output_tokens=30, session="s", finish_s=0.7),
        TraceRequest(arrival_s=0.2, prompt_tokens=200, output_tokens=10),  # open loop, at its own time
    ]
    trace = rebase(turns, source="sessions")
    plan = plan_replay(trace, profile, profile_path=PROFILE, workers=1, phase_s=60.0)
    raw = run_policy(plan.scenario, StaticSchedule.plain(0), profile=profile, load=plan.load(), priced=False)
    first, second = sorted((r for r in raw.records.requests if r.stream is not None), key=lambda r: r.arrival_s)
    assert first.finish_s > 0.1, "the replayed first turn takes longer than the recorded one"
    assert math.isclose(second.arrival_s, first.finish_s + 0.5), "think time 0.5 s after the replayed finish"
    (open_loop,) = [r for r in raw.records.requests if r.stream is None]
    assert open_loop.arrival_s == 0.2


def test_unknown_tier_and_class_map_are_refused_by_name() -> None:
    profile = load_profile(PROFILE)
    trace = rebase([TraceRequest(arrival_s=0, prompt_tokens=1, output_tokens=1, tier="gold")], source="t")
    with pytest.raises(ConfigError, match="tier 'gold'"):
        plan_replay(trace, profile, profile_path=PROFILE, workers=1)
    ok = rebase([TraceRequest(arrival_s=0, prompt_tokens=1, output_tokens=1)], source="t")
    with pytest.raises(ConfigError, match=r"class_map\[acme\]"):
        plan_replay(ok, profile, profile_path=PROFILE, workers=1, class_map={"acme": "poetry"})


def test_workload_comes_from_hint_then_tenant_map_then_default() -> None:
    profile = load_profile(PROFILE)
    reqs = [
        TraceRequest(arrival_s=0, prompt_tokens=1, output_tokens=1, tenant="a", workload="maths"),
        TraceRequest(arrival_s=1, prompt_tokens=1, output_tokens=1, tenant="a"),
        TraceRequest(arrival_s=2, prompt_tokens=1, output_tokens=1, tenant="b", workload="limericks"),
    ]
    plan = plan_replay(rebase(reqs, source="t"), profile, profile_path=PROFILE, workers=1, class_map={"a": "code"})
    assert [s.workload for s in plan.specs] == ["maths", "code", profile.default_workload]
    assert plan.unknown_hints == {"limericks": 1}


def test_acceptance_from_the_store_picks_the_class_the_workers_measured() -> None:
    profile = load_profile(PROFILE)
    k = 3
    want = "maths"
    length = expected_tokens_per_step(conditional_acceptance(profile, want, 2000), k)
    assert closest_class(profile, length, k, 2000) == want
    state = WorkerState(
        worker_id="w0", model="m", k_desired=k, k_applied=k, accepted_length=length, acceptance_per_pos=[],
        usd_per_mtok=None, updated_at=0.0,
    )  # fmt: skip
    reqs = [TraceRequest(arrival_s=0, prompt_tokens=2000, output_tokens=1, tenant="t", worker_id="w0")]
    assert tenant_classes(rebase(reqs, source="t"), {"w0": state}, profile) == {"t": want}


def test_replay_runs_every_policy_and_writes_the_report(tmp_path: Path) -> None:
    profile = load_profile(PROFILE)
    trace = rebase(_known_trace(60), source="known")
    plan = plan_replay(trace, profile, profile_path=PROFILE, workers=2, phase_s=40.0)
    result = replay(plan, processes=1)
    assert {"k=0", "k=1", "k=2", "k=4", "k=7", "gearshift", "oracle"} <= set(result.runs)
    assert set(result.oracle_choice) == {p.name for p in plan.scenario.phases}
    for run in result.runs.values():
        assert set(run.tiers) == {"interactive", "batch"}
        assert run.metrics.goodput_tok_s <= run.metrics.throughput_tok_s + 1e-9
    path = write(result, tmp_path, command="gearshift bench replay t", stem="r")
    text = path.read_text()
    assert verdict(result) in text
    assert "than static k=7 (the recipe default)" in text
    assert (tmp_path / "r-goodput.png").stat().st_size > 0
    assert (tmp_path / "r-k.png").stat().st_size > 0
    single = run_one(plan, StaticSchedule.plain(7), profile)
    assert single.metrics.goodput_tok_s == result.runs["k=7"].metrics.goodput_tok_s, "a replay is deterministic"


def test_the_replay_command_writes_a_report_and_names_a_bad_row(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "arrival_s,prompt_tokens,output_tokens,tier\n"
        + "".join(f"{i * 0.9},{200 + i},{8 + i % 5},batch\n" for i in range(30))
    )
    out = tmp_path / "out"
    ok = CliRunner().invoke(
        app, ["bench", "replay", str(trace), "--workers", "1", "--processes", "1", "--out", str(out)]
    )
    assert ok.exit_code == 0, ok.output
    assert "than static k=7 (the recipe default) on this trace" in (out / "replay.md").read_text()
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n1,2,3\n2,3,x\n")
    bad = CliRunner().invoke(app, ["bench", "replay", str(trace), "--out", str(out)])
    assert bad.exit_code == 2
    assert f"{trace}:3: output_tokens: not a number" in bad.output.replace("\n", "")


@pytest.mark.parametrize("warmup_s", [0.0, 25.0])
def test_a_streamed_replay_gives_the_in_memory_figures_bit_for_bit(tmp_path: Path, warmup_s: float) -> None:
    """Every figure of every policy (the oracle included), folded as the run goes, equals the one computed from
    every kept record: an overloaded fleet (backlog, a drain, requests unfinished at the end), tiers with an SLA,
    sessions, several phases, and a warm-up that cuts a phase."""
    profile = load_profile(PROFILE)
    path = tmp_path / "t.jsonl"
    synthetic_trace(path, duration_s=90.0, rate_per_s=9.0, seed=3)
    trace = read_trace(path)
    turns = [dataclasses.replace(r, session=f"s{i % 5}") if i % 4 == 0 else r for i, r in enumerate(trace.requests)]
    trace = dataclasses.replace(trace, requests=tuple(turns))
    plan = plan_replay(trace, profile, profile_path=PROFILE, workers=1, phase_s=30.0)
    plan = dataclasses.replace(plan, scenario=plan.scenario.model_copy(update={"warmup_s": warmup_s}))
    streamed = fingerprint(replay(plan, processes=1))
    kept = fingerprint(replay(plan, processes=1, streamed=False))
    assert count_fields(kept) > 500
    assert list(differences(kept, streamed)) == []
    backlog = [run["metrics"]["requests_unfinished"] for run in kept["runs"].values()]
    assert max(backlog) > 0, "the scenario leaves requests unfinished at the window's end"


def test_a_diurnal_trace_is_busiest_at_noon_and_keeps_its_mean_rate(tmp_path: Path) -> None:
    path = tmp_path / "day.jsonl"
    n = synthetic_trace(path, duration_s=86_400.0, rate_per_s=0.05, diurnal=True)
    arrivals = [r.arrival_s for r in read_trace(path).requests]
    night = sum(1 for t in arrivals if t < 3 * 3600 or t >= 21 * 3600)
    noon = sum(1 for t in arrivals if 9 * 3600 <= t < 15 * 3600)
    assert noon > 2 * night
    assert abs(n / 86_400.0 - 0.05) < 0.05 * 0.1, "the day's mean rate is the one asked for"


def test_replay_speed_measures_in_a_fresh_process_and_reports_worker_seconds() -> None:
    r = measure(duration_s=20.0, rate_per_s=2.0, workers=2, policy="k=2")
    assert r.requests > 10
    assert r.simulated_s >= 20.0
    assert r.peak_rss_bytes > 2**20
    assert r.cpu_s > 0
    assert r.worker_s_per_wall_s == pytest.approx(2 * r.ratio)
