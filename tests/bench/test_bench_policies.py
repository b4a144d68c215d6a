"""Policies on the real virtual lab: static tables, the phase oracle, the controller, and the oracle choice."""

from __future__ import annotations

from bench.policy.lab import run_policy
from bench.policy.policies import ControllerPolicy, PhaseOracle, StaticSchedule
from bench.policy.run_metrics import summarise
from bench.policy.scenario import Scenario
from bench.policy.suite import oracle_ks, threshold_gate, vllm_table
from fleet.perf import load_profile

PROFILE = load_profile("kimi-k3-dspark-tp16")


def _scenario(**extra: object) -> Scenario:
    chat = [{"workload": "chat", "output_tokens": {"mean": 50}, "prompt_tokens": {"mean": 200}}]
    return Scenario.model_validate(
        {
            "name": "tiny",
            "description": "two short phases",
            "workers": 1,
            "max_num_seqs": 64,
            "phases": [
                {"name": "one", "duration_s": 6, "arrival": {"kind": "closed", "concurrency": 4}, "mix": chat},
                {"name": "two", "duration_s": 6, "arrival": {"kind": "closed", "concurrency": 8}, "mix": chat},
            ],
            **extra,
        }
    ).on(PROFILE)


def test_static_schedule_is_clipped_to_the_worker() -> None:
    table = StaticSchedule("t", ((1, 3, 8), (4, 127, 4), (128, 512, 0)))
    assert table.start_schedule(k_max=6, max_num_seqs=64) == ((1, 3, 6), (4, 64, 4))
    assert StaticSchedule.plain(2).start_schedule(k_max=8, max_num_seqs=64) == ((1, 64, 2),)


def test_static_k_runs_at_that_k() -> None:
    raw = run_policy(_scenario(), StaticSchedule.plain(2), profile=PROFILE)
    assert {s.k for s in raw.records.steps if s.decode_seqs} == {2}
    assert all(t.k == 2 for t in raw.ticks)


def test_phase_oracle_switches_at_the_phase_boundary() -> None:
    raw = run_policy(_scenario(), PhaseOracle("oracle", {"one": 0, "two": 6}), profile=PROFILE)
    decode = [s for s in raw.records.steps if s.decode_seqs]
    assert {s.k for s in decode if s.end_s <= 6.0} == {0}
    assert {s.k for s in decode if 6.1 <= s.start_s < 12.0} == {6}


def test_the_controller_runs_in_virtual_time() -> None:
    raw = run_policy(_scenario(), ControllerPolicy(), profile=PROFILE)
    m = summarise(raw, PROFILE)
    assert m.requests_finished > 0
    assert len(raw.ticks) >= 12 / 2 - 1


def test_baseline_tables_are_valid_vllm_tables() -> None:
    sc = _scenario()
    for policy in (vllm_table(PROFILE, sc), threshold_gate(PROFILE, sc)):
        schedule = policy.start_schedule(k_max=8, max_num_seqs=sc.seqs)
        assert schedule[0][0] == 1
        assert schedule[-1][1] == sc.seqs


def test_oracle_takes_the_best_static_k_per_phase() -> None:
    sc = _scenario()
    statics = [summarise(run_policy(sc, StaticSchedule.plain(k), profile=PROFILE), PROFILE) for k in (0, 8)]
    choice = oracle_ks(sc, statics)
    for phase in sc.phases:
        best = max(statics, key=lambda m: next(p.goodput_tok_s for p in m.phases if p.name == phase.name))
        assert choice[phase.name] == int(best.policy.removeprefix("k="))


def test_runs_are_deterministic() -> None:
    sc = _scenario().scaled(0.5)
    a = summarise(run_policy(sc, StaticSchedule.plain(4), profile=PROFILE), PROFILE)
    b = summarise(run_policy(sc, StaticSchedule.plain(4), profile=PROFILE), PROFILE)
    assert (a.goodput_tok_s, a.throughput_tok_s) == (b.goodput_tok_s, b.throughput_tok_s)
