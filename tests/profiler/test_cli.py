"""``gearshift profile`` against a ``gearshift sim serve`` subprocess: the command writes a loadable profile."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench.procs import start_sim
from fleet.perf import load_profile
from gearshift.cli.app import app

from .conftest import CONTROL_TOKEN

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def sim_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``gearshift sim serve`` (Kimi K3 profile, k_max 7) at 5× real time on a free port."""
    env = {"GEARSHIFT_CONTROL_TOKEN": CONTROL_TOKEN}
    proc = start_sim("profiled", log_dir=tmp_path_factory.mktemp("sim"), speedup=5.0, env=env, timeout_s=20.0)
    try:
        yield proc.url
    finally:
        proc.stop(timeout_s=10.0)


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["profile", *args], env={"GEARSHIFT_CONTROL_TOKEN": CONTROL_TOKEN})
    return result.exit_code, result.stdout, result.stderr


def test_profile_writes_a_loadable_profile(sim_url: str, tmp_path: Path) -> None:
    out = tmp_path / "sim.yaml"
    grid = ["--batch-sizes", "1,2,4", "--ks", "0,1,4", "--window-steps", "8", "--poll", "0.02"]
    code, _, err = invoke("--worker", sim_url, "--out", str(out), "--name", "sim-profile", *grid)
    assert code == 0, err
    assert f"wrote {out}" in err
    assert err.count("B=") == 9
    profile = load_profile(out)
    assert profile.name == "sim-profile"
    assert profile.drafter.k_max == 7
    assert profile.default_workload == "measured"
    assert len(profile.acceptance["measured"].base) == 4


def test_a_k_above_the_workers_k_max_is_refused_by_name(sim_url: str) -> None:
    code, _, err = invoke("--worker", sim_url, "--ks", "0,9")
    assert code == 1
    assert "ks: [9] exceed the worker's k_max 7" in err


def test_malformed_lists_are_usage_errors() -> None:
    code, _, err = invoke("--worker", "http://127.0.0.1:9", "--batch-sizes", "1,x")
    assert code == 2
    assert "--batch-sizes" in err
