"""The catch-up ledger of the idle-drafter skip: which positions a skipped drafter must replay, and in what forwards."""

from __future__ import annotations

import pytest

from workers.vllm.drafter_lag import DrafterLag, Segment, pack


def test_a_request_skipped_over_several_steps_replays_one_contiguous_run() -> None:
    lag = DrafterLag()
    # step 0: "a" prefills 5 tokens from 0, "b" decodes one at 9; step 1: both decode one
    s0 = lag.skipped(["a", "b"], [0, 5, 6], [0, 9])
    s1 = lag.skipped(["a", "b"], [0, 1, 2], [5, 10])
    (a, b) = lag.due(["a", "b"], [6, 11])
    assert (a.row, a.first, a.end) == (0, 0, 6)
    assert a.segments == (Segment(step=s0, offset=0, first=0, length=5), Segment(step=s1, offset=0, first=5, length=1))
    assert (b.row, b.first, b.end, b.length) == (1, 9, 11, 2)
    assert not lag  # caught up: the ledger is empty


def test_only_requests_of_the_step_are_due_and_the_rest_wait() -> None:
    lag = DrafterLag()
    lag.skipped(["a", "b"], [0, 1, 2], [3, 7])
    (due,) = lag.due(["b"], [8])
    assert due.req_id == "b"
    assert due.row == 0
    assert lag  # "a" still waits for its next step
    (a,) = lag.due(["c", "a"], [0, 4])
    assert (a.row, a.first) == (1, 3)


def test_a_run_that_does_not_end_where_the_step_starts_is_not_replayed() -> None:
    lag = DrafterLag()
    lag.skipped(["a"], [0, 1], [3])
    assert lag.due(["a"], [9]) == []
    assert not lag


def test_a_recompute_from_zero_replaces_the_run_and_one_from_a_cached_prefix_is_given_up() -> None:
    lag = DrafterLag()
    lag.skipped(["a", "b"], [0, 1, 2], [10, 10])
    lag.skipped(["a", "b"], [0, 11, 15], [0, 4])  # both preempted and recomputed: a from 0, b from a cached prefix
    due = lag.due(["a", "b"], [11, 8])
    assert [(c.req_id, c.first, c.end) for c in due] == [("a", 0, 11)]


def test_zero_length_rows_and_finished_requests_leave_no_entry() -> None:
    lag = DrafterLag()
    step = lag.skipped(["a", "b"], [0, 0, 2], [4, 6])
    assert lag.stashes_in_use() == {step}
    lag.forget_all_but(["a"])
    assert not lag
    assert lag.stashes_in_use() == set()


def test_pack_keeps_forwards_under_the_budget_with_one_piece_per_request_in_order() -> None:
    lag = DrafterLag()
    lag.skipped(["a", "b"], [0, 7, 10], [0, 20])
    due = lag.due(["a", "b"], [7, 23])
    forwards = pack(due, max_tokens=4)
    assert [[(c.req_id, lo, hi) for c, lo, hi in f] for f in forwards] == [
        [("a", 0, 4)],
        [("a", 4, 7), ("b", 20, 21)],
        [("b", 21, 23)],
    ]
    for forward in forwards:
        assert sum(hi - lo for _, lo, hi in forward) <= 4
        assert len({c.req_id for c, _, _ in forward}) == len(forward)
    with pytest.raises(ValueError, match="max_tokens"):
        pack(due, max_tokens=0)
