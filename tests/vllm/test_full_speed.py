"""The advertised full-speed set: GET shows it, a PUT outside it is a 400 naming it, the lookup stays untouched."""

from __future__ import annotations

import pytest

from fleet.clock import ManualClock
from fleet.speculation import FullSpeed, ScheduleError, check_full_speed, full_speed_rows
from workers.vllm.api import render
from workers.vllm.control import EngineSpeculation, EngineView

HOPPER: FullSpeed = ((0, 1, 8), (1, 1, 4), (2, 1, 2), (3, 1, 2), (4, 1, 1), (5, 1, 1), (6, 1, 1), (7, 1, 1))
"""What the K3 Hopper recipe (8 sequences, 8 captured tokens) runs at full speed (test_gears.py)."""


def hopper_engine(full_speed: FullSpeed | None = HOPPER) -> tuple[EngineSpeculation, list[int]]:
    lookup = [0, 7, 6, 5, 4, 3, 2, 1, 0]
    view = EngineView(lookup=lookup, k_max=7, max_num_seqs=8, method="dspark", full_speed=full_speed)
    return EngineSpeculation(view, worker_id="k3-hopper", clock=ManualClock()), lookup


def test_rows_compress_pairs_by_k_then_batch_size() -> None:
    assert full_speed_rows([(1, 3), (0, 2), (0, 1), (1, 1), (0, 4)]) == ((0, 1, 2), (0, 4, 4), (1, 1, 1), (1, 3, 3))


def test_get_advertises_the_full_speed_rows() -> None:
    spec, _ = hopper_engine()
    state = spec.handle({"op": "get"})["state"]
    assert state["full_speed"] == [list(row) for row in HOPPER]


def test_a_put_inside_the_set_is_applied() -> None:
    spec, lookup = hopper_engine()
    reply = spec.handle(
        {"op": "put", "update": {"schedule": [[1, 1, 7], [2, 2, 3], [3, 4, 1], [5, 8, 0]], "version": 1}}
    )
    assert reply["status"] == 200
    assert lookup == [0, 7, 3, 1, 1, 0, 0, 0, 0]


def test_a_put_outside_the_set_is_a_400_naming_k_and_batch_size() -> None:
    spec, lookup = hopper_engine()
    before = list(lookup)
    reply = spec.handle({"op": "put", "update": {"k": 7, "version": 1}})
    assert (reply["status"], reply["type"]) == (400, "invalid_schedule")
    assert "k 7 at batch size 2 is outside this worker's full-speed set" in reply["error"]
    assert "batch sizes 1-1" in reply["error"]
    assert lookup == before
    response = render(reply)
    assert response.status_code == 400
    assert b'"param":"schedule"' in response.body


def test_batch_sizes_without_any_graph_refuse_no_gear() -> None:
    check_full_speed(((1, 2, 0), (3, 64, 5)), ((0, 1, 2),))  # 3…64: no k has a graph there
    with pytest.raises(ScheduleError, match=r"schedule\[0\]: k 5 at batch size 1"):
        check_full_speed(((1, 64, 5),), ((0, 1, 2),))


def test_without_a_set_every_gear_is_full_speed() -> None:
    spec, lookup = hopper_engine(full_speed=None)
    assert spec.handle({"op": "get"})["state"]["full_speed"] is None
    assert spec.handle({"op": "put", "update": {"k": 7, "version": 1}})["status"] == 200
    assert lookup == [0] + [7] * 8
