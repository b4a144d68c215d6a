"""``gearshift worker vllm --dry-run``: the command line an operator would run."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gearshift.cli.app import app

KIMI_FLEET = str(Path(__file__).resolve().parents[2] / "deploy" / "fleets" / "kimi-k3-dspark.yaml")


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["worker", "vllm", *args])
    return result.exit_code, result.stdout, result.stderr


def test_dry_run_prints_the_kimi_command_for_a_headless_node() -> None:
    code, out, _ = run("--fleet-file", KIMI_FLEET, "--worker-id", "kimi-k3-1", "--dry-run")
    assert code == 0
    words = shlex.split(out)
    assert words[:4] == ["GEARSHIFT_WORKER_ID=kimi-k3-1", "VLLM_PLUGINS=gearshift", "vllm", "serve"]
    spec = json.loads(words[words.index("--speculative-config") + 1])
    assert (spec["method"], spec["num_speculative_tokens"]) == ("dspark", 8)
    code, out, _ = run(
        "--fleet-file", KIMI_FLEET, "--worker-id", "kimi-k3-1", "--dry-run", "--nnodes", "2", "--node-rank", "1"
    )
    assert code == 0
    assert "--headless" in shlex.split(out)


def test_cpu_module_form() -> None:
    args = ("--fleet-file", KIMI_FLEET, "--worker-id", "kimi-k3-0", "--dry-run", "--module", "--cpu")
    code, out, _ = run(*args, "--python", "/opt/py")
    assert code == 0
    words = shlex.split(out)
    assert "/opt/py" in words
    assert "VLLM_TARGET_DEVICE=cpu" in words


def test_unknown_worker_and_simulated_worker_are_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GEARSHIFT_FLEET_FILE", raising=False)
    code, _, err = run("--fleet-file", KIMI_FLEET, "--worker-id", "nope", "--dry-run")
    assert code == 2
    assert "--worker-id: no worker 'nope'" in err
    code, _, err = run("--worker-id", "sim-0", "--dry-run")  # the embedded default fleet is simulated
    assert code == 2
    assert "kind:" in err
    bad = tmp_path / "fleet.yaml"
    bad.write_text("models: []\nworkers: [{id: w}]\n")
    code, _, err = run("--fleet-file", str(bad), "--worker-id", "w", "--dry-run")
    assert code == 2
    assert "workers[0]" in err
