"""Engine-side speculation control over a fake dense lookup (what vLLM's scheduler reads each step)."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.clock import ManualClock
from workers.vllm.control import EngineSpeculation, EngineView, schedule_from_dense

MAX_NUM_SEQS = 8
K_MAX = 4


def startup_lookup(k: int = K_MAX) -> list[int]:
    """vLLM's dense list for [[1, MAX_NUM_SEQS, k]]: index 0 unused (0), then k for each batch size."""
    return [0] + [k] * MAX_NUM_SEQS


def make(lookup: list[int] | None = None, **view: Any) -> tuple[EngineSpeculation, list[int], ManualClock]:
    dense = startup_lookup() if lookup is None else lookup
    clock = ManualClock()
    fields: dict[str, Any] = {"lookup": dense, "k_max": K_MAX, "max_num_seqs": MAX_NUM_SEQS, "method": "ngram"} | view
    return EngineSpeculation(EngineView(**fields), worker_id="w0", clock=clock), dense, clock


def put(spec: EngineSpeculation, **update: Any) -> dict[str, Any]:
    return spec.handle({"op": "put", "update": update})


def test_start_up_schedule_is_read_from_the_engines_lookup() -> None:
    spec, _, _ = make(lookup=[0, 4, 4, 3, 3, 3, 1, 1, 1])
    state = spec.handle({"op": "get"})["state"]
    assert state["schedule"] == [[1, 2, 4], [3, 5, 3], [6, 8, 1]]
    assert state["fallback_schedule"] == state["schedule"]
    assert (state["version"], state["k_max"], state["method"], state["worker_id"]) == (0, K_MAX, "ngram", "w0")


def test_put_rewrites_the_same_list_object_in_place() -> None:
    spec, dense, _ = make()
    reply = put(spec, schedule=[[1, 2, 3], [3, 8, 1]], version=1, lease_seconds=30)
    assert reply["status"] == 200
    assert dense == [0, 3, 3, 1, 1, 1, 1, 1, 1]
    assert reply["state"]["schedule"] == [[1, 2, 3], [3, 8, 1]]


def test_k_zero_turns_drafting_off_for_every_batch_size() -> None:
    spec, dense, _ = make()
    assert put(spec, k=0, version=1)["status"] == 200
    assert dense[1:] == [0] * MAX_NUM_SEQS


def test_lease_expiry_before_a_step_restores_the_start_up_schedule() -> None:
    spec, dense, clock = make()
    put(spec, k=1, version=3, lease_seconds=5)
    clock.advance(4.9)
    spec.before_step()
    assert dense[1:] == [1] * MAX_NUM_SEQS
    clock.advance(0.2)
    spec.before_step()
    assert dense == startup_lookup()
    reply = spec.handle({"op": "get"})
    assert reply["lease_expiries"] == 1
    assert reply["state"]["lease_expires_at"] is None
    assert reply["state"]["version"] == 3


def test_get_expires_a_lease_on_an_idle_engine() -> None:
    spec, dense, clock = make()
    put(spec, k=2, version=1, lease_seconds=1)
    clock.advance(2)
    assert spec.handle({"op": "get"})["state"]["schedule"] == [[1, MAX_NUM_SEQS, K_MAX]]
    assert dense == startup_lookup()


@pytest.mark.parametrize(
    ("update", "status", "kind", "needle"),
    [
        ({"k": K_MAX + 1, "version": 1}, 400, "invalid_schedule", "exceeds this worker's k_max 4"),
        ({"schedule": [[1, 3, 2], [5, 8, 2]], "version": 1}, 400, "invalid_schedule", "gap"),
        ({"schedule": [[1, 4, 2], [4, 8, 2]], "version": 1}, 400, "invalid_schedule", "overlap"),
        ({"schedule": [[1, 8, -1]], "version": 1}, 400, "invalid_schedule", "negative"),
        ({"k": 2, "schedule": [[1, 8, 2]], "version": 1}, 400, "invalid_schedule", "exactly one"),
        ({"k": 2}, 400, "invalid_request", "version"),
        ({"k": 2, "version": 1, "lease_seconds": 0}, 400, "invalid_request", "lease_seconds"),
        ({"k": 2, "version": 1, "colour": "red"}, 400, "invalid_request", "colour"),
    ],
)
def test_a_bad_update_is_refused_and_leaves_the_lookup_alone(
    update: dict[str, Any], status: int, kind: str, needle: str
) -> None:
    spec, dense, _ = make()
    reply = put(spec, **update)
    assert (reply["status"], reply["type"]) == (status, kind)
    assert needle in reply["error"]
    assert dense == startup_lookup()


def test_an_older_version_is_a_conflict_and_the_same_version_is_idempotent() -> None:
    spec, dense, _ = make()
    assert put(spec, k=2, version=5)["status"] == 200
    assert put(spec, k=2, version=5)["status"] == 200
    older = put(spec, k=1, version=4)
    assert (older["status"], older["type"]) == (409, "stale_version")
    assert dense[1:] == [2] * MAX_NUM_SEQS


def test_without_a_per_batch_size_table_every_call_is_refused_with_the_fix() -> None:
    spec = EngineSpeculation(
        EngineView(lookup=None, k_max=K_MAX, max_num_seqs=MAX_NUM_SEQS, method="ngram"),
        worker_id="w0",
        clock=ManualClock(),
    )
    spec.before_step()  # harmless
    for request in ({"op": "get"}, {"op": "put", "update": {"k": 1, "version": 1}}):
        reply = spec.handle(request)
        assert (reply["status"], reply["type"]) == (409, "speculation_control_unavailable")
        assert "num_speculative_tokens_per_batch_size" in reply["error"]
    assert not spec.available


def test_without_speculative_decoding_calls_are_refused() -> None:
    spec = EngineSpeculation(
        EngineView(lookup=None, k_max=0, max_num_seqs=MAX_NUM_SEQS, method=None), worker_id="w0", clock=ManualClock()
    )
    reply = spec.handle({"op": "get"})
    assert reply["status"] == 409
    assert "without speculative decoding" in reply["error"]


def test_a_disabled_instance_names_its_reason() -> None:
    view = EngineView(lookup=startup_lookup(), k_max=K_MAX, max_num_seqs=MAX_NUM_SEQS, method="ngram")
    spec = EngineSpeculation.disabled(view, "invalid settings: worker_id")
    spec.before_step()
    assert spec.handle({"op": "get"}) == {
        "status": 409,
        "type": "speculation_control_unavailable",
        "error": "invalid settings: worker_id",
    }


def test_unknown_operation_is_a_bad_request() -> None:
    spec, _, _ = make()
    assert spec.handle({"op": "delete"})["status"] == 400


def test_schedule_from_dense_compresses_runs() -> None:
    assert schedule_from_dense([0, 2]) == ((1, 1, 2),)
    assert schedule_from_dense([0, 1, 1, 0, 0, 1]) == ((1, 2, 1), (3, 4, 0), (5, 5, 1))
