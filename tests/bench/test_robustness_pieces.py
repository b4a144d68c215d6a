"""The robustness report can be regenerated a piece at a time: a run of some cells replaces those in
``robustness.json`` and keeps every other, and the report is rebuilt from all of them."""

from __future__ import annotations

from pathlib import Path

from bench.markdown import parse_table
from bench.policy.robustness import RESULTS, Cell, CellResult, load_results, write

FAMILY = ["kimi-k3-dspark-mi355x-tp8", "kimi-k3-dspark-tp16"]
MI, TP16 = FAMILY


def _result(cell: Cell, scenario: str, wrong: float, right: float = 1000.0) -> CellResult:
    return CellResult(cell, scenario, wrong, right, 1.0, 2.0)


def _losses(md: str, believed: str) -> list[tuple[str, str, str]]:
    _, rows = parse_table(md, f"## Controller believes {believed}")
    return [(r[0], r[1], r[4]) for r in rows]


def test_a_piece_replaces_its_cells_and_keeps_the_others(tmp_path: Path) -> None:
    slow, fast = Cell(MI, "step", 1.3), Cell(MI, "step", 0.7)
    other = Cell(TP16, "profile", other=MI)
    write([_result(slow, "straddle", 900.0), _result(other, "phase-shift", 800.0)], tmp_path, command="a",
          family=FAMILY)  # fmt: skip
    path = write([_result(slow, "straddle", 990.0), _result(fast, "phase-shift", 1000.0)], tmp_path, command="b",
                 family=FAMILY)  # fmt: skip
    md = path.read_text()
    # in the grid's order: phase-shift before straddle, step ×0.7 before ×1.3; the rerun cell's new figures
    assert _losses(md, MI) == [("step time ×0.7", "phase-shift", "+0.0%"), ("step time ×1.3", "straddle", "+1.0%")]
    assert _losses(md, TP16) == [(f"workers run {MI}", "phase-shift", "+20.0%")]  # kept from the first run
    assert "**2/3 cells within 5%.**" in md
    assert len(load_results(tmp_path / RESULTS)) == 3


def test_a_stored_cell_of_a_profile_no_longer_in_the_family_is_dropped(tmp_path: Path) -> None:
    write([_result(Cell("gone-profile", "step", 1.3), "straddle", 900.0)], tmp_path, command="a",
          family=[*FAMILY, "gone-profile"])  # fmt: skip
    write([_result(Cell(MI, "step", 1.3), "straddle", 990.0)], tmp_path, command="b", family=FAMILY)
    assert [r.cell.believed for r in load_results(tmp_path / RESULTS)] == [MI]


def test_stored_figures_round_trip(tmp_path: Path) -> None:
    results = [_result(Cell(MI, "acceptance", 0.7), "straddle", 987.654321), _result(Cell(MI, "profile", other=TP16),
               "phase-shift", 1.5)]  # fmt: skip
    write(results, tmp_path, command="a", family=FAMILY)
    assert load_results(tmp_path / RESULTS) == sorted(results, key=lambda r: r.scenario)
