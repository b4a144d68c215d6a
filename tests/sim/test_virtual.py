"""The virtual-time driver: event order, arrival processes, records, the tick hook, determinism."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

from bench.policy.virtual_speed import measure
from fleet.clock import ManualClock
from fleet.perf import StepShape, load_profile, step_time
from fleet.speculation import SpeculationUpdate
from workers.sim.arrivals import (
    ArrivalProcess,
    Lengths,
    Phase,
    PhasedLoad,
    RequestKind,
    RequestSpec,
    TraceLoad,
    WorkloadMix,
    closed_loop,
    poisson,
)
from workers.sim.records import RequestRecord, RunRecords
from workers.sim.virtual import TickContext, VirtualLab, VirtualWorker, make_worker

PROFILE = load_profile("kimi-k3-dspark-tp16")
SHORT = WorkloadMix.single("chat", Lengths(200), Lengths(40))


def lab_of(
    n_workers: int, load: ArrivalProcess, *, k: int = 4, seed: int = 3, drafter_loaded: bool = True, **kwargs: Any
) -> VirtualLab:
    clock = ManualClock()
    workers = [
        make_worker(PROFILE, f"w{i}", clock, k=k, seed=seed + i, drafter_loaded=drafter_loaded)
        for i in range(n_workers)
    ]
    return VirtualLab(workers, load, clock=clock, seed=seed, **kwargs)


def fingerprint(records: RunRecords) -> list[tuple[object, ...]]:
    return [(r.request_id, r.worker_id, r.workload, r.arrival_s, r.first_token_s, r.finish_s) for r in records.requests]


def test_same_seed_same_run_and_another_seed_another_run() -> None:
    mix = WorkloadMix(
        (
            RequestKind("chat", Lengths(300, 0.5), Lengths(60, 0.5)),
            RequestKind("maths", Lengths(100, 0.5), Lengths(80, 0.5)),
        )
    )
    a = lab_of(2, poisson(20.0, mix), seed=7).run(5.0)
    b = lab_of(2, poisson(20.0, mix), seed=7).run(5.0)
    c = lab_of(2, poisson(20.0, mix), seed=8).run(5.0)
    assert len(a.requests) > 20
    assert fingerprint(a) == fingerprint(b)
    assert [s.end_s for s in a.steps] == [s.end_s for s in b.steps]
    assert fingerprint(a) != fingerprint(c)


def test_running_in_pieces_equals_running_at_once() -> None:
    whole = lab_of(1, closed_loop(3, SHORT)).run(6.0)
    lab = lab_of(1, closed_loop(3, SHORT))
    for until in (0.5, 2.0, 2.0, 6.0):
        lab.run(until)
    assert fingerprint(lab.records) == fingerprint(whole)
    with pytest.raises(ValueError, match="until_s"):
        lab.run(1.0)


def test_closed_loop_keeps_exactly_n_requests_in_flight() -> None:
    seen: list[int] = []

    def tick(ctx: TickContext) -> None:
        seen.append(sum(w.outstanding for w in ctx.workers))

    records = lab_of(2, closed_loop(6, SHORT), tick_s=0.25, on_tick=tick).run(8.0)
    assert len(records.finished()) > 12
    assert seen == [6] * len(seen)


def test_simultaneous_arrivals_share_the_first_step() -> None:
    records = lab_of(1, closed_loop(4, SHORT)).run(1.0)
    first = records.steps[0]
    assert first.start_s == 0.0
    assert first.prefill_tokens == 4 * 200


def test_a_request_arriving_mid_step_joins_the_next_step() -> None:
    first = RequestSpec("chat", 200, 50)
    late = RequestSpec("chat", 100, 5)
    step0 = step_time(PROFILE, StepShape(0, 0, 0, prefill_tokens=200)).total_s
    records = lab_of(1, TraceLoad([(0.0, first), (step0 / 2, late)])).run(1.0)
    assert records.steps[0].prefill_tokens == 200
    assert records.steps[1].start_s == pytest.approx(step0)
    assert records.steps[1].prefill_tokens == 100
    assert records.requests[1].ttft_s == pytest.approx(records.steps[1].end_s - step0 / 2)


def test_single_stream_tpot_is_the_mean_decode_step() -> None:
    mix = WorkloadMix.single("maths", Lengths(100), Lengths(30))
    records = lab_of(1, closed_loop(1, mix), k=0, drafter_loaded=False).run(0.5)
    req = records.finished()[0]
    decode = [s for s in records.steps if req.first_token_s < s.end_s <= req.finish_s]
    assert len(decode) == req.output_tokens - 1 == 29
    assert req.tpot_s == pytest.approx(sum(s.duration_s for s in decode) / len(decode))
    assert req.ttft_s == pytest.approx(records.steps[0].duration_s)
    assert all(s.k == 0 and s.drafter_s == 0 for s in records.steps)


def test_poisson_arrival_count_matches_the_rate() -> None:
    rate, horizon = 50.0, 40.0
    records = lab_of(4, poisson(rate, SHORT), seed=11).run(horizon)
    n = len(records.requests)
    assert abs(n - rate * horizon) < 4 * math.sqrt(rate * horizon)
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(records.requests, records.requests[1:], strict=False)]
    assert min(gaps) >= 0


def test_phases_change_load_and_workload_over_time() -> None:
    maths = WorkloadMix.single("maths", Lengths(100), Lengths(30))
    phases = [
        Phase(3.0, SHORT, concurrency=2, name="low"),
        Phase(3.0, maths, concurrency=6, name="high"),
        Phase(3.0, SHORT, concurrency=1, name="drop"),
        Phase(3.0, SHORT, rate_per_s=5.0, name="open"),
    ]
    in_flight: list[tuple[float, int]] = []

    def tick(ctx: TickContext) -> None:
        in_flight.append((ctx.now_s, sum(w.outstanding for w in ctx.workers)))

    records = lab_of(1, PhasedLoad(phases), tick_s=0.5, on_tick=tick).run(14.0)
    assert {r.workload for r in records.requests if r.phase == "high"} == {"maths"}
    assert {r.workload for r in records.requests if r.phase != "high"} == {"chat"}
    assert {r.phase for r in records.requests} == {"low", "high", "drop", "open"}
    assert all(n == 2 for t, n in in_flight if t < 3.0)
    assert all(n == 6 for t, n in in_flight if 3.0 <= t < 6.0)
    assert any(n == 1 for t, n in in_flight if 7.0 <= t < 9.0)
    assert all(r.stream is None for r in records.requests if r.phase == "open")
    assert not [r for r in records.requests if r.arrival_s >= 12.0]


def test_bursts_arrive_together() -> None:
    load = PhasedLoad([Phase(2.0, SHORT, burst_size=5, burst_every_s=0.5, name="b")])
    records = lab_of(2, load).run(3.0)
    times = sorted({r.arrival_s for r in records.requests})
    assert times == pytest.approx([0.5, 1.0, 1.5])
    assert len(records.requests) == 15


def test_least_outstanding_router_balances_workers() -> None:
    records = lab_of(4, closed_loop(8, SHORT)).run(0.01)
    per_worker = [sum(1 for r in records.requests if r.worker_id == f"w{i}") for i in range(4)]
    assert per_worker == [2, 2, 2, 2]


def test_tick_hook_runs_every_tick_and_can_shift_the_gear() -> None:
    times: list[float] = []
    scraped: list[bytes] = []

    def tick(ctx: TickContext) -> None:
        times.append(ctx.now_s)
        worker: VirtualWorker = ctx.workers[0]
        if len(times) == 2:
            worker.control.apply(SpeculationUpdate(k=1, version=1, lease_seconds=600))
            scraped.append(worker.metrics_text())

    records = lab_of(1, closed_loop(2, SHORT), k=6, tick_s=0.5, on_tick=tick).run(2.2)
    assert times == pytest.approx([0.5, 1.0, 1.5, 2.0])
    decode_k = [(s.start_s, s.k) for s in records.steps if s.decode_seqs]
    assert {k for t, k in decode_k if t < 1.0} == {6}
    assert {k for t, k in decode_k if t >= 1.0} == {1}
    assert b"vllm:spec_decode_num_drafts_total" in scraped[0]
    assert b'gearshift_worker_spec_k{from_bs="1",to_bs="256"} 1.0' in scraped[0]


def test_lease_expiry_follows_the_virtual_clock() -> None:
    def tick(ctx: TickContext) -> None:
        if ctx.now_s == pytest.approx(0.5):
            ctx.workers[0].control.apply(SpeculationUpdate(k=0, version=1, lease_seconds=1.0))

    records = lab_of(1, closed_loop(1, SHORT), k=5, tick_s=0.5, on_tick=tick).run(3.0)
    decode_k = [(s.start_s, s.k) for s in records.steps if s.decode_seqs]
    assert {k for t, k in decode_k if 0.6 < t < 1.4} == {0}
    assert {k for t, k in decode_k if t > 1.6} == {5}


def test_record_summaries() -> None:
    records = lab_of(1, closed_loop(2, SHORT)).run(5.0)
    total = sum(s.tokens for s in records.steps)
    assert records.output_tokens(0.0, 5.0) == total == sum(r.output_tokens for r in records.requests)
    assert records.throughput(0.0, 5.0) == pytest.approx(total / 5.0)
    assert 1.0 <= records.tokens_per_decode_step() <= 5.0
    assert all(r.arrival_s >= 1.0 for r in records.finished(arrived_from_s=1.0))
    with pytest.raises(ValueError, match="end_s"):
        records.throughput(2.0, 2.0)


def test_mix_deck_matches_the_weights_exactly() -> None:
    mix = WorkloadMix(
        (
            RequestKind("chat", Lengths(10), Lengths(10), weight=3),
            RequestKind("code", Lengths(10), Lengths(10), weight=1),
        ),
        deck_size=8,
    )
    assert sorted(mix.deck()) == [0] * 6 + [1] * 2
    records = lab_of(1, closed_loop(1, mix)).run(3.0)
    first = records.requests[:8]
    assert [r.workload for r in first].count("code") == 2


def test_lengths_sample_their_mean_and_validate() -> None:
    import random

    rng = random.Random(0)
    assert Lengths(123).sample(rng) == 123
    draws = [Lengths(500, 0.6).sample(rng) for _ in range(4000)]
    assert abs(sum(draws) / len(draws) - 500) < 25
    assert min(Lengths(500, 2.0, min=10, max=900).sample(rng) for _ in range(200)) >= 10
    with pytest.raises(ValueError, match="mean"):
        Lengths(0)
    with pytest.raises(ValueError, match="weight"):
        RequestKind("chat", Lengths(1), Lengths(1), weight=0)
    with pytest.raises(ValueError, match="duration_s"):
        Phase(0.0, SHORT)
    with pytest.raises(ValueError, match="tick_s"):
        lab_of(1, closed_loop(1, SHORT), tick_s=0.0)


def test_speed_benchmark_runs_the_reference_load_and_scrapes_every_worker() -> None:
    result = measure(
        PROFILE, workers=2, streams_per_worker=3, simulated_s=30.0, k=PROFILE.drafter.k_max, scrape_every_s=10.0
    )
    assert result.scrapes == 2 * 3
    assert result.steps > 0
    assert result.finished_requests > 0
    assert result.output_tokens > result.finished_requests
    assert result.ratio > 0
    assert result.cpu_ratio > 0


def test_closed_loop_think_time_separates_a_streams_requests() -> None:
    records = lab_of(1, closed_loop(2, SHORT, think_s=0.5)).run(10.0)
    by_stream: dict[int | None, list[RequestRecord]] = {}
    for r in records.requests:
        by_stream.setdefault(r.stream, []).append(r)
    assert set(by_stream) == {0, 1}
    for reqs in by_stream.values():
        assert len(reqs) > 3
        for done, following in itertools.pairwise(reqs):
            assert following.arrival_s == pytest.approx(done.finish_s + 0.5)
