"""``bench.chaos.report`` on a hand-made result: the invariants turn "not met" on each kind of bad measurement, and
the report and its plot are written."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.chaos.faults import FAULTS
from bench.chaos.load import Sent
from bench.chaos.measure import Admission, failures
from bench.chaos.report import PLOT, checks, write
from bench.chaos.run import ChaosConfig, ChaosResult, FaultResult
from bench.markdown import parse_table
from bench.soak.client import StreamResult
from bench.soak.ledger import LedgerDiff


def _result(**changes: Any) -> ChaosResult:
    sent = [Sent("free", 0, StreamResult(status=200, started=100.0 + i, ended=100.5 + i, done=True)) for i in range(5)]
    fault = FaultResult(
        fault=FAULTS[0],
        failures=failures(sent),
        ledger=LedgerDiff(answered=5, records=5, missing=0, duplicate=0, wrong_amount=0, unknown=0, no_request_id=0,
                          unanswered_billed=0),
        admissions=[Admission("rpm", 60, 60, 1, True)],
        recover_s=0.0,
        unroutable=[],
        routable_after_s=0.0,
        notes=[],
        elapsed_s=6.0,
        injected_s=1.0,
        healed_s=3.0,
        started_at=100.0,
        sent=sent,
    )  # fmt: skip
    return ChaosResult(config=ChaosConfig(faults=(FAULTS[0],)), results=[replace(fault, **changes)])


def _unmet(result: ChaosResult) -> set[str]:
    return {c.name for c in checks(result) if not c.met}


def test_a_clean_run_meets_every_invariant() -> None:
    assert _unmet(_result()) == set()


def test_each_bad_measurement_fails_its_invariant() -> None:
    base = _result().results[0]
    missing = replace(base.ledger, missing=1)
    assert _unmet(_result(ledger=missing)) == {"0 ledger differences"}
    over = [Admission("rpm", 60, 62, 1, True)]
    assert _unmet(_result(admissions=over)) == {"no over-admission beyond the bound"}
    assert _unmet(_result(unroutable=["gateway-0: w3 (ejected)"])) == {"no worker left unroutable"}
    assert _unmet(_result(failures=replace(base.failures, failed=1, unclean=1))) == {"every failure clean"}
    assert _unmet(_result(recover_s=None)) == {"the load recovered after every fault"}


def test_the_report_and_its_plot_are_written(tmp_path: Path) -> None:
    path = write(_result(), tmp_path, command="gearshift bench chaos --fault redis-master")
    report = path.read_text()
    _, rows = parse_table(report, "## Per fault")
    assert [row[0] for row in rows] == ["redis-master"]
    assert f"]({PLOT})" in report
    assert (tmp_path / PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
