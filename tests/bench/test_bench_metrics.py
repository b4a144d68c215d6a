"""Run metrics from hand-made records: SLA goodput, cost split, switch counting."""

from __future__ import annotations

import math

import pytest

from bench.policy.lab import RawRun, TickSample
from bench.policy.run_metrics import meets_sla, summarise
from bench.policy.scenario import Scenario
from fleet.perf import load_profile
from workers.sim.records import RequestRecord, RunRecords, StepRecord

SCENARIO = Scenario.model_validate(
    {
        "name": "unit",
        "description": "hand-made records",
        "workers": 1,
        "max_num_seqs": 256,
        "gpus_per_worker": 16,
        "phases": [
            {"name": "a", "duration_s": 10, "arrival": {"kind": "closed", "concurrency": 1}, "mix": [{}]},
            {"name": "b", "duration_s": 10, "arrival": {"kind": "closed", "concurrency": 1}, "mix": [{}]},
        ],
    }
)


def _req(rid: str, tier: str, arrival: float, first: float, finish: float, tokens: int) -> RequestRecord:
    return RequestRecord(
        rid, "w0", "chat", 100, tokens, arrival, tag=tier, first_token_s=first, finish_s=finish, output_tokens=tokens
    )


def _raw(
    requests: list[RequestRecord],
    steps: list[StepRecord],
    ticks: list[TickSample] | None = None,
    marks: dict[float, list[int]] | None = None,
) -> RawRun:
    """A run whose token marks at the boundaries (0, 10, 20 s) are ``marks`` (default: none delivered)."""
    records = RunRecords(("w0",), requests=requests, steps=steps)
    marks = marks or {t: [0] * len(requests) for t in (0.0, 10.0, 20.0)}
    return RawRun(SCENARIO, "p", records, ticks=ticks or [], marks=marks)


def test_sla_uses_the_tier_targets() -> None:
    fast = _req("a", "interactive", 0.0, 0.5, 0.5 + 0.04 * 99, 100)  # TPOT 40 ms, TTFT 0.5 s
    slow = _req("b", "interactive", 0.0, 0.5, 0.5 + 0.06 * 99, 100)  # TPOT 60 ms > 50 ms
    late = _req("c", "interactive", 0.0, 3.0, 3.0 + 0.01 * 99, 100)  # TTFT 3 s > 2 s
    batch = _req("d", "batch", 0.0, 9.0, 9.0 + 0.5 * 99, 100)  # no targets
    assert [meets_sla(r, SCENARIO.tiers.get(r.tag)) for r in (fast, slow, late, batch)] == [True, False, False, True]


def test_goodput_counts_tokens_delivered_in_the_window_by_requests_on_their_sla() -> None:
    good = _req("a", "interactive", 1.0, 1.5, 1.5 + 0.04 * 99, 100)
    bad = _req("b", "interactive", 2.0, 2.5, 2.5 + 0.08 * 99, 100)  # TPOT 80 ms: misses, counts zero
    in_drain = _req("c", "batch", 12.0, 12.5, 25.0, 300)  # 160 tokens by the window's end, the rest in the drain
    on_track = RequestRecord("d", "w0", "chat", 100, 400, 15.0, tag="interactive", first_token_s=15.5)
    off_track = RequestRecord("e", "w0", "chat", 100, 400, 14.0, tag="interactive", first_token_s=14.5)
    for r, n in ((on_track, 300), (off_track, 300)):
        r.output_tokens = n  # their final counts (after the window): only the marks matter
    marks = {0.0: [0, 0, 0, 0, 0], 10.0: [100, 90, 0, 0, 0], 20.0: [100, 100, 160, 100, 50]}
    steps = [StepRecord(0, 0.0, 1.0, 4, 2, 0, 8, 0.9, 0.1), StepRecord(0, 1.0, 1.0, 0, 2, 0, 2, 1.0, 0.0)]
    m = summarise(_raw([good, bad, in_drain, on_track, off_track], steps, marks=marks))
    # on_track: TPOT so far (20 − 15.5) / 99 = 45 ms ≤ 50 ms keeps its 100; off_track: 5.5 / 49 = 112 ms, zero
    assert m.goodput_tok_s == pytest.approx((100 + 160 + 100) / 20)
    assert [p.goodput_tok_s for p in m.phases] == [pytest.approx(10.0), pytest.approx(26.0)]
    assert m.throughput_tok_s == pytest.approx(10 / 20)
    assert (m.requests_finished, m.requests_unfinished) == (2, 3)
    assert m.sla_attainment == {"batch": 1.0, "interactive": 0.5}
    assert (m.backlog.start, m.backlog.end, m.backlog.growing) == (0, 3, False)


def test_a_policy_that_starves_a_tier_in_the_window_gets_no_credit_for_the_drain() -> None:
    """Ten batch requests served only after the window's end: the old drain-crediting goodput counted their
    5 000 tokens; delivered-in-window goodput counts none, and the backlog is seen to grow."""
    chat = [_req(f"i{i}", "interactive", float(i), i + 0.5, i + 0.5 + 0.04 * 99, 100) for i in range(8)]
    starved = [_req(f"b{i}", "batch", 1.0 + i, 30.0, 40.0, 500) for i in range(10)]
    waiting = RequestRecord("late", "w0", "chat", 100, 100, 15.0, tag="interactive")  # no first token by 20 s
    requests = [*chat, *starved, waiting]
    at_10 = [100 if i + 0.5 + 0.04 * 99 <= 10 else 50 for i in range(8)] + [0] * 11
    marks = {0.0: [0] * 19, 10.0: at_10, 20.0: [100] * 8 + [0] * 11}
    m = summarise(_raw(requests, [], marks=marks))
    assert m.goodput_tok_s == pytest.approx(8 * 100 / 20)
    assert m.sla_attainment == {"batch": 1.0, "interactive": pytest.approx(8 / 9)}  # "late" waited 5 s > 2 s
    assert (m.backlog.end, m.backlog.growing) == (11, True)
    assert m.phases[0].backlog.growing


def test_cost_split_adds_up_and_charges_rejected_drafts() -> None:
    profile = load_profile("kimi-k3-dspark-tp16")
    # 4 sequences at k=4 emit 8 tokens: 4 bonus + 4 accepted of 16 drafted, so 75 % of drafts were rejected.
    steps = [StepRecord(0, float(i), 0.5, 4, 4, 0, 8, 0.4, 0.1) for i in range(10)]
    m = summarise(_raw([], steps), profile)
    c = m.cost
    assert c.total == pytest.approx(c.target + c.drafter + c.rejected_drafts + c.idle)
    assert m.drafter_share == pytest.approx(10 * 0.1 / 20)
    assert c.idle == pytest.approx(c.total * (20 - 5) / 20)
    assert 0 < m.rejected_share < 10 * 0.4 / 20
    assert m.accepted_length == pytest.approx(2.0)
    usd_per_s = SCENARIO.gpus * SCENARIO.usd_per_gpu_hour / 3600
    assert c.total == pytest.approx(usd_per_s * 20 / 80 * 1e6)


def test_switches_per_worker_minute_count_tick_changes_only() -> None:
    ticks = [TickSample(float(t), 0, k, 1, 0) for t, k in enumerate([8, 8, 4, 4, 8, 8])]
    steps = [StepRecord(0, float(i), 0.5, k, 1, 0, 1, 0.5, 0.0) for i, k in enumerate([8, 0, 8, 0])]
    m = summarise(_raw([], steps, ticks))
    assert m.switches_per_worker_min == pytest.approx(2 / (20 / 60))
    assert m.step_k_changes_per_worker_min == pytest.approx(3 / (20 / 60))
    assert math.isnan(m.ttft_p50_s)
