"""``gearshift controller explain`` and ``gearshift controller ramp``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from controller.settings import ControllerSettings
from gearshift.cli.app import app
from gearshift.cli.controller import sample
from gearshift.cli.explain import explain
from workers.sim.server import SimServer

from .ctl_helpers import CONTROL_TOKEN, LAB_PROFILE


def fleet_file(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "fleet.yaml"
    fleet = {
        "models": [{"name": "kimi-k3", "profile": str(LAB_PROFILE)}],
        "workers": [{"id": "rt-0", "url": url, "model": "kimi-k3"}],
    }
    path.write_text(yaml.safe_dump(fleet))
    return path


async def test_explain_shows_every_candidate_and_the_reason(sim_server: SimServer, tmp_path: Path) -> None:
    settings = ControllerSettings(
        fleet_file=fleet_file(tmp_path, sim_server.url), tick_s=0.2, dry_run=True, metrics_port=0,
        control_token=CONTROL_TOKEN,
    )  # fmt: skip
    controller = await sample(settings, 2)
    console = Console(record=True, width=200)
    console.print(explain(controller.workers.values()))
    text = console.export_text()
    assert "rt-0 (kimi-k3)" in text
    assert "TPOT target 50 ms" in text  # the default tenants' interactive tier
    for k in (0, 1, 2, 3, 4, 6, 8):
        assert f"│ {k} │" in text, k
    assert "goodput" in text
    assert "hold → k=8" in text  # first complete window: no change yet, with its reason
    assert sim_server.worker.control.version == 0, "explain never applies"


@pytest.mark.slow
def test_ramp_command_compares_the_controller_with_static_k(tmp_path: Path) -> None:
    out = tmp_path / "ramp.md"
    result = CliRunner().invoke(
        app,
        ["controller", "ramp", "--profile", str(LAB_PROFILE), "--levels", "1,64,1", "--phase-s", "40",
         "--prompt-tokens", "200", "--output-tokens", "300", "--markdown", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    text = out.read_text()
    for policy in ("static k=0", "static k=8", "controller"):
        assert f"| {policy} |" in text
    throughput = {
        cells[1].strip(): float(cells[2])
        for line in text.splitlines()
        if line.startswith(("| static", "| controller")) and len(cells := line.split("|")) > 3
    }
    assert set(throughput) == {"static k=0", "static k=8", "controller"}
    # Deterministic virtual time: the controller tracks the better static k in each phase.
    assert throughput["controller"] >= 0.95 * max(throughput["static k=0"], throughput["static k=8"])
    assert "| 2 | 64 |" in text


def test_ramp_rejects_bad_levels() -> None:
    result = CliRunner().invoke(app, ["controller", "ramp", "--levels", "1,x"])
    assert result.exit_code != 0
    assert "levels" in result.output
