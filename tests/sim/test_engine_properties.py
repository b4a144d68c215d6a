"""Invariants of the engine core over random workloads, sizes and schedules (hypothesis)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from workers.sim.scheduler import SchedulingPolicy

from .engine_helpers import make_engine, req, run_to_completion

requests = st.lists(
    st.tuples(
        st.integers(1, 300),  # prompt tokens
        st.integers(1, 120),  # max tokens
        st.sampled_from(["maths", "code", "chat", "long-context", "unknown-class"]),
        st.integers(0, 3),  # priority
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(
    reqs=requests,
    k_small=st.integers(0, 7),
    k_large=st.integers(0, 7),
    split=st.integers(1, 8),
    max_num_seqs=st.integers(1, 8),
    kv_blocks=st.integers(30, 200),
    budget=st.integers(16, 512),
    scheduling=st.sampled_from(["fcfs", "priority"]),
    seed=st.integers(0, 3),
)
def test_every_request_completes_and_the_counters_agree(
    reqs: list[tuple[int, int, str, int]],
    k_small: int,
    k_large: int,
    split: int,
    max_num_seqs: int,
    kv_blocks: int,
    budget: int,
    scheduling: SchedulingPolicy,
    seed: int,
) -> None:
    engine = make_engine(
        schedule=((1, split, k_small), (split + 1, 256, k_large)),
        max_num_seqs=max_num_seqs,
        kv_capacity_tokens=max(kv_blocks * 16, 16 * ((300 + 120 + 8) // 16 + 2)),
        max_num_batched_tokens=budget,
        scheduling=scheduling,
        seed=seed,
    )
    for i, (prompt, max_tokens, workload, priority) in enumerate(reqs):
        engine.add(req(f"r{i}", prompt, max_tokens, workload=workload, priority=priority))
    outcomes, received = run_to_completion(engine, max_steps=20_000)

    assert received == {f"r{i}": r[1] for i, r in enumerate(reqs)}
    assert sorted(rid for o in outcomes for rid in o.finished) == sorted(received)
    s = engine.stats
    assert s.generation_tokens == sum(r[1] for r in reqs)
    assert s.prompt_tokens == sum(r[0] for r in reqs)
    assert s.num_accepted_tokens <= s.num_draft_tokens <= 7 * s.num_drafts
    assert sum(s.accepted_per_pos) == s.num_accepted_tokens
    assert all(a >= b for a, b in itertools.pairwise(s.accepted_per_pos))
    assert (s.running, s.waiting, s.kv_usage) == (0, 0, 0.0)
    assert s.ttft_s.count == s.e2e_s.count == len(reqs)
    assert s.iteration_tokens.count == s.steps == len(outcomes)
    for o in outcomes:
        assert len(o.emitted) <= max_num_seqs
        assert o.decode_seqs <= max_num_seqs
        assert o.prefill_tokens + o.decode_seqs <= budget
        assert o.k in (0, k_small, k_large)
        assert o.duration_s > 0
