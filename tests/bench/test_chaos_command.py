"""chaos.md's "Regenerate with" line is the bench's own command, built from its options: under pytest (the heavy
test) it printed pytest's argv (``gearshift bench heavy --timeout=900 ...``). The bench itself is replaced by a
result with no faults, so this runs in well under a second."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench.chaos import report
from bench.chaos.run import ChaosConfig, ChaosResult
from gearshift.cli.app import app


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, "gearshift bench chaos"),
        ({"fast": True}, "gearshift bench chaos --fast"),
        ({"faults": ["worker-kill", "gateway-kill"], "before": 3.0, "speedup": 2.5},
         "gearshift bench chaos --fault worker-kill --fault gateway-kill --before 3 --speedup 2.5"),
        ({"fast": True, "out": Path("/tmp/a b/out")}, "gearshift bench chaos --fast --out '/tmp/a b/out'"),
        ({"out": report.DEFAULT_OUT, "after": 7.5}, "gearshift bench chaos --after 7.5"),
    ],
)  # fmt: skip
def test_the_command_is_built_from_the_options(options: dict[str, object], expected: str) -> None:
    assert report.command_line(**options) == expected  # type: ignore[arg-type]


def test_the_report_names_the_bench_command_not_the_argv_it_ran_under(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_faults(cfg: ChaosConfig, run_dir: Path, **_: object) -> ChaosResult:
        return ChaosResult(config=cfg)

    monkeypatch.setattr("bench.chaos.run.run_chaos", no_faults)
    monkeypatch.setattr(sys, "argv", ["pytest", "heavy", "--timeout=900", "-q"])
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["bench", "chaos", "--fast", "--fault", "worker-kill", "--out", str(out), "--run-dir", str(tmp_path)]
    )
    assert (out / "chaos.md").exists(), result.output
    text = (out / "chaos.md").read_text()
    assert f"Regenerate with `gearshift bench chaos --fast --fault worker-kill --out {out}`" in text
    assert "timeout=900" not in text
