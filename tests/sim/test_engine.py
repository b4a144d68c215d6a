"""The simulated engine core: batching limits, chunked prefill, preemption, scheduling order, speculation."""

from __future__ import annotations

import itertools

import pytest

from fleet.clock import ManualClock
from fleet.speculation import SpeculationUpdate

from .engine_helpers import PROFILE, make_engine, req, run_to_completion, step


def test_running_batch_is_capped_at_max_num_seqs() -> None:
    engine = make_engine(max_num_seqs=4)
    for i in range(10):
        engine.add(req(f"r{i}"))
    out = step(engine)
    assert engine.stats.running == 4
    assert engine.stats.waiting == 6
    assert set(out.emitted) == {"r0", "r1", "r2", "r3"}


def test_long_prompt_is_prefilled_in_chunks_of_the_token_budget() -> None:
    engine = make_engine(max_num_batched_tokens=256)
    engine.add(req("long", prompt=1000, max_tokens=5))
    chunks = [step(engine) for _ in range(4)]
    assert [o.prefill_tokens for o in chunks] == [256, 256, 256, 232]
    assert [o.emitted for o in chunks] == [{}, {}, {}, {"long": 1}]
    assert engine.stats.prompt_tokens == 1000


def test_decoding_requests_are_scheduled_before_new_prefill_within_the_budget() -> None:
    engine = make_engine(max_num_batched_tokens=64, schedule=((1, 256, 3),))
    engine.add(req("a", prompt=10, max_tokens=100))
    step(engine)
    engine.add(req("b", prompt=500, max_tokens=5))
    out = step(engine)
    assert out.decode_seqs == 1
    assert out.prefill_tokens == 64 - (1 + 3)


def test_every_request_gets_exactly_max_tokens_even_under_preemption() -> None:
    engine = make_engine(kv_capacity_tokens=1024, schedule=((1, 256, 7),))
    for i in range(6):
        engine.add(req(f"r{i}", prompt=200, max_tokens=120))
    outcomes, received = run_to_completion(engine)
    assert engine.stats.num_preemptions > 0
    assert any(o.preempted for o in outcomes)
    assert received == {f"r{i}": 120 for i in range(6)}
    assert engine.stats.prompt_tokens == 6 * 200, "a recomputed prompt is counted once, as vLLM does"
    assert engine.stats.generation_tokens == 6 * 120
    assert engine.stats.kv_usage == 0.0


def test_preempted_request_recomputes_prompt_and_generated_tokens() -> None:
    engine = make_engine(kv_capacity_tokens=512, schedule=((1, 256, 0),), max_num_batched_tokens=4096)
    engine.add(req("old", prompt=200, max_tokens=200))
    engine.add(req("new", prompt=200, max_tokens=200))
    generated_before = 0
    outcomes = []
    for _ in range(1000):
        out = step(engine)
        outcomes.append(out)
        if "new" in out.preempted:
            break
        generated_before += out.emitted.get("new", 0)
    assert outcomes[-1].preempted == ["new"], "the later request is the FCFS victim"
    readmitted = next(o for o in (step(engine) for _ in range(1000)) if o.prefill_tokens)
    assert readmitted.prefill_tokens == 200 + generated_before, "recompute covers the prompt and generated tokens"
    assert readmitted.emitted == {"new": 1}, "the recompute ends by sampling the next token"


def test_priority_scheduling_admits_the_lowest_priority_value_first() -> None:
    engine = make_engine(max_num_seqs=1, scheduling="priority")
    engine.add(req("batch", priority=10))
    engine.add(req("urgent", priority=0))
    assert set(step(engine).emitted) == {"urgent"}


def test_fcfs_scheduling_admits_in_arrival_order_whatever_the_priority() -> None:
    engine = make_engine(max_num_seqs=1, scheduling="fcfs")
    engine.add(req("first", priority=10))
    engine.add(req("second", priority=0))
    assert set(step(engine).emitted) == {"first"}


def test_priority_preemption_evicts_the_least_urgent_request() -> None:
    engine = make_engine(kv_capacity_tokens=512, scheduling="priority", schedule=((1, 256, 0),))
    engine.add(req("low", prompt=200, max_tokens=200, priority=5))
    engine.add(req("high", prompt=200, max_tokens=200, priority=1))
    preempted: list[str] = []
    for _ in range(400):
        preempted += step(engine).preempted
        if preempted:
            break
    assert preempted == ["low"]


@pytest.mark.parametrize(("streams", "expected_k"), [(1, 6), (2, 6), (3, 2), (8, 2)])
def test_k_is_looked_up_by_decode_batch_size(streams: int, expected_k: int) -> None:
    engine = make_engine(schedule=((1, 2, 6), (3, 256, 2)))
    for i in range(streams):
        engine.add(req(f"r{i}", max_tokens=100))
    first = step(engine)
    assert first.k == 0, "a pure prefill step drafts nothing"
    out = step(engine)
    assert out.decode_seqs == streams
    assert out.k == expected_k
    assert engine.stats.num_draft_tokens == streams * expected_k


def test_k_zero_means_no_drafts_and_one_token_per_step() -> None:
    engine = make_engine(schedule=((1, 256, 0),), drafter_loaded=False)
    engine.add(req("r", max_tokens=30))
    outcomes, received = run_to_completion(engine)
    st = engine.stats
    assert (st.num_drafts, st.num_draft_tokens, st.num_accepted_tokens) == (0, 0, 0)
    assert all(n == 1 for o in outcomes for n in o.emitted.values())
    assert received == {"r": 30}
    assert all(o.drafter_s == 0.0 for o in outcomes)


def test_k_zero_with_the_drafter_loaded_pays_the_idle_drafter_tax_and_drafter_free_never_drafts() -> None:
    tax = PROFILE.drafter.k0_tax
    assert tax is not None
    loaded = make_engine(schedule=((1, 256, 0),))
    loaded.add(req("r", max_tokens=30))
    outcomes, _ = run_to_completion(loaded)
    decode = [o for o in outcomes if o.decode_seqs]
    assert decode
    assert all(o.drafter_s == pytest.approx(o.target_s * tax.fraction(o.decode_seqs)) for o in decode)
    free = make_engine(schedule=((1, 256, 4),), drafter_loaded=False)  # a schedule cannot make it speculate
    free.add(req("r", max_tokens=30))
    outcomes, _ = run_to_completion(free)
    assert free.stats.num_drafts == 0
    assert all(o.k == 0 and o.drafter_s == 0.0 for o in outcomes)


def test_speculation_counters_are_consistent() -> None:
    engine = make_engine(schedule=((1, 256, 5),), seed=3)
    for i in range(8):
        engine.add(req(f"r{i}", max_tokens=400, workload="code"))
    run_to_completion(engine)
    st = engine.stats
    assert st.num_drafts > 0
    assert st.num_draft_tokens == 5 * st.num_drafts
    assert 0 < st.num_accepted_tokens <= st.num_draft_tokens
    assert sum(st.accepted_per_pos) == st.num_accepted_tokens
    pos = st.accepted_per_pos
    assert all(a >= b for a, b in itertools.pairwise(pos)), pos
    assert pos[5:] == [0] * (len(pos) - 5), "positions beyond k are never drafted"
    assert st.num_drafts <= st.generation_tokens


def test_acceptance_follows_the_workload_class() -> None:
    def mean_accepted_length(workload: str) -> float:
        engine = make_engine(schedule=((1, 256, 7),), seed=1)
        for i in range(4):
            engine.add(req(f"r{i}", max_tokens=500, workload=workload))
        run_to_completion(engine)
        return engine.stats.mean_accepted_length

    assert mean_accepted_length("maths") > mean_accepted_length("chat") + 1.0


def test_same_seed_gives_identical_runs_and_another_seed_differs() -> None:
    def trace(seed: int) -> list[tuple[float, dict[str, int]]]:
        engine = make_engine(seed=seed)
        for i in range(5):
            engine.add(req(f"r{i}", max_tokens=200))
        outcomes, _ = run_to_completion(engine)
        return [(o.duration_s, o.emitted) for o in outcomes]

    assert trace(7) == trace(7)
    assert trace(7) != trace(8)


def test_speculation_reserves_kv_lookahead_for_the_drafts() -> None:
    def kv_after_first_decode(k: int) -> float:
        engine = make_engine(schedule=((1, 256, k),), kv_capacity_tokens=160)  # 10 blocks of 16 tokens
        engine.add(req("r", prompt=25, max_tokens=100))
        step(engine)
        step(engine)
        return engine.stats.kv_usage

    assert kv_after_first_decode(0) == pytest.approx(0.2)  # 25 + 1 tokens → 2 blocks
    assert kv_after_first_decode(7) == pytest.approx(0.3)  # 25 + 1 + 7 lookahead → 3 blocks


def test_expired_lease_reverts_to_the_fallback_before_the_step() -> None:
    clock = ManualClock()
    engine = make_engine(schedule=((1, 256, 2),), clock=clock)
    engine.control.apply(SpeculationUpdate(k=7, version=1, lease_seconds=5))
    engine.add(req("r", max_tokens=100))
    step(engine)
    assert step(engine).k == 7
    clock.advance(6)
    assert step(engine).k == 2
    assert engine.control.lease_expiries == 1


def test_abort_frees_the_request_and_its_kv() -> None:
    engine = make_engine()
    engine.add(req("r", max_tokens=100))
    step(engine)
    assert engine.stats.kv_usage > 0
    assert engine.abort("r") is True
    assert engine.abort("r") is False
    assert not engine.has_work()
    assert engine.stats.kv_usage == 0.0


def test_aborting_a_waiting_request_removes_it_from_the_queue() -> None:
    engine = make_engine(max_num_seqs=1, scheduling="priority")
    for i in range(3):
        engine.add(req(f"r{i}", priority=i))
    step(engine)
    assert engine.abort("r2")
    assert engine.stats.waiting == 1


def test_finished_requests_are_reported_once_with_output_capped_at_max_tokens() -> None:
    engine = make_engine(schedule=((1, 256, 7),), seed=2)
    engine.add(req("r", max_tokens=3, workload="maths"))
    outcomes, received = run_to_completion(engine)
    assert received == {"r": 3}
    assert [rid for o in outcomes for rid in o.finished] == ["r"]


def test_add_rejects_duplicates_and_requests_that_cannot_fit() -> None:
    engine = make_engine(kv_capacity_tokens=1024)
    engine.add(req("r"))
    with pytest.raises(ValueError, match="already"):
        engine.add(req("r"))
    with pytest.raises(ValueError, match="KV cache"):
        engine.add(req("big", prompt=1000, max_tokens=100))


def test_request_latency_histograms_are_recorded_on_the_engine_clock() -> None:
    engine = make_engine()
    engine.add(req("r", max_tokens=20))
    outcomes, _ = run_to_completion(engine)
    st = engine.stats
    assert st.ttft_s.count == 1
    assert st.ttft_s.sum == pytest.approx(outcomes[0].duration_s)
    assert st.e2e_s.count == 1
    assert st.e2e_s.sum == pytest.approx(sum(o.duration_s for o in outcomes))
    assert st.itl_s.count == len(outcomes) - 1
    assert st.tpot_s.count == 1
    assert st.iteration_tokens.count == st.steps == len(outcomes)
    assert st.busy_s == pytest.approx(st.target_s + st.drafter_s)


def test_the_token_budget_trims_drafts_of_the_last_decoding_request() -> None:
    engine = make_engine(schedule=((1, 256, 4),), max_num_batched_tokens=12)
    for i in range(3):
        engine.add(req(f"r{i}", prompt=4, max_tokens=50))
    assert step(engine).prefill_tokens == 12
    out = step(engine)
    assert out.decode_seqs == 3
    st = engine.stats
    assert (st.num_drafts, st.num_draft_tokens) == (3, 4 + 4 + 1)
