"""``gearshift worker vllm --dry-run``: the command line an operator would run."""

from __future__ import annotations

import itertools
import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleet.config import load_fleet
from fleet.speculation import dense_lookup
from gearshift.cli.app import app
from workers.vllm.launcher import worker_gear_plan

KIMI_FLEET = str(Path(__file__).resolve().parents[2] / "deploy" / "fleets" / "kimi-k3-dspark.yaml")


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["worker", "vllm", *args])
    return result.exit_code, result.stdout, result.stderr


def test_dry_run_prints_the_kimi_command_for_a_headless_node() -> None:
    code, out, _ = run("--fleet-file", KIMI_FLEET, "--worker-id", "kimi-k3-1", "--dry-run")
    assert code == 0
    words = shlex.split(out)
    assert words[:5] == [
        "GEARSHIFT_WORKER_ID=kimi-k3-1",
        "VLLM_PLUGINS=gearshift",
        "VLLM_USE_V2_MODEL_RUNNER=1",
        "vllm",
        "serve",
    ]
    spec = json.loads(words[words.index("--speculative-config") + 1])
    assert (spec["method"], spec["num_speculative_tokens"]) == ("dspark", 7)
    code, out, _ = run(
        "--fleet-file", KIMI_FLEET, "--worker-id", "kimi-k3-1", "--dry-run", "--nnodes", "2", "--node-rank", "1"
    )
    assert code == 0
    assert "--headless" in shlex.split(out)


def test_dry_run_speculative_config_covers_every_advertised_gear() -> None:
    """Every (k, batch size) the launch should run at full speed has a start-up row for k (so MRv2 captures
    query length k + 1) and its exact decode size among the capture sizes (test_capture_coverage.py checks
    with vLLM's code that this is what gets captured)."""
    code, out, _ = run("--fleet-file", KIMI_FLEET, "--worker-id", "kimi-k3-0", "--dry-run")
    assert code == 0
    words = shlex.split(out)
    spec = json.loads(words[words.index("--speculative-config") + 1])
    max_num_seqs = int(words[words.index("--max-num-seqs") + 1])
    start = words.index("--cudagraph-capture-sizes") + 1
    sizes = {int(w) for w in itertools.takewhile(str.isdigit, words[start:])}
    table = spec["num_speculative_tokens_per_batch_size"]
    gears = set(dense_lookup(tuple(tuple(r) for r in table), max_num_seqs=max_num_seqs)[1:])
    worker = load_fleet(Path(KIMI_FLEET)).worker("kimi-k3-0")
    assert worker is not None
    advertised = worker_gear_plan(worker).expected_full_speed()
    assert {k for k, _, _ in advertised} == gears == set(range(spec["num_speculative_tokens"] + 1))
    for k, lo, hi in advertised:
        assert {n * (k + 1) for n in range(lo, hi + 1)} <= sizes, f"k {k}: a decode size is not captured"
    assert (lo, hi) == (1, max_num_seqs)


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
