"""``gearshift bench chaos --fast``: the CI subset of the fault matrix on real processes (a Redis Cluster, four
simulated workers, two gateways, two controllers). The command must exit 0 and its report must show, for every
fault of the subset: no ledger difference, no limit admitted beyond its bound, no worker left unroutable, and no
unclean failure. The verdicts are the bench's own measurements read back from the report (the report's
invariants table is checked against its per-fault rows, so a report that says "met" over a bad row fails too).

Heavy: about 2-3 minutes of processes (``scripts/heavy-tests.sh``). Timings are never asserted."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench.chaos.faults import FAST
from bench.markdown import parse_table
from gearshift.cli.app import app

pytestmark = [pytest.mark.heavy, pytest.mark.redis, pytest.mark.cluster, pytest.mark.timeout(420)]


def test_the_fast_fault_matrix_keeps_every_invariant(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["bench", "chaos", "--fast", "--out", str(out), "--run-dir", str(tmp_path / "run")]
    )
    report = (out / "chaos.md").read_text() if (out / "chaos.md").exists() else ""
    assert result.exit_code == 0, result.output[-4000:] + report

    _, invariants = parse_table(report, "## Invariants")
    assert {row[0]: row[1] for row in invariants} == {
        "faults run": "met",
        "0 ledger differences": "met",
        "no over-admission beyond the bound": "met",
        "no worker left unroutable": "met",
        "every failure clean": "met",
        "the load recovered after every fault": "met",
    }

    head, rows = parse_table(report, "## Per fault")
    by_fault = {row[0]: dict(zip(head, row, strict=True)) for row in rows}
    assert set(by_fault) == set(FAST)
    for fault, row in by_fault.items():
        assert int(row["requests"]) > 0, fault
        assert int(row["ok"]) > 0, fault
        assert row["ledger missing / duplicate / wrong / unknown"] == "0 / 0 / 0 / 0", fault
        assert row["unclean"] == "0", fault
        assert row["left unroutable"] == "none", fault
        assert row["recover s"] != "not recovered", fault

    _, limits = parse_table(report, "## Limits")
    assert {(row[0], row[1]) for row in limits} == {(f, lim) for f in FAST for lim in ("rpm", "tpm", "concurrency",
                                                                                          "budget")}  # fmt: skip
    assert all(row[7] == "met" for row in limits), [row for row in limits if row[7] != "met"]
    assert any(row[6] == "yes" for row in limits)  # some limit was actually reached under the faults' load
