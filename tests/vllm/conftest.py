"""Fixtures of the real-engine tests: the vLLM virtualenv, the tiny model, and a real vLLM CPU server."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.procs import free_port
from fleet.config import WorkerConfig
from workers.vllm.cpu_server import (
    REPO_ROOT,
    VLLM_VENV,
    RunningServer,
    ServerStartError,
    build_tiny_model,
    running_server,
    tiny_plan,
    tiny_worker,
)
from workers.vllm.launcher import CpuOptions

CONTROL_TOKEN = "real-engine-test-token"
ENV_BUILD_TIMEOUT_S = 900.0


@pytest.fixture(scope="session")
def vllm_env() -> None:
    """``.venv-vllm`` exists and is current: ``scripts/vllm-env.sh`` is idempotent (instant when up to date;
    scripts/test.sh runs it before pytest so the build never counts against a test's timeout)."""
    result = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "vllm-env.sh")],
        capture_output=True,
        text=True,
        timeout=ENV_BUILD_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(
            f"scripts/vllm-env.sh failed ({result.returncode}):\n{result.stdout}\n{result.stderr}", pytrace=False
        )


@pytest.fixture(scope="session")
def tiny_model_dir(vllm_env: None) -> Path:
    """The tiny model, kept beside the vLLM virtualenv (rebuilt only when its spec changes)."""
    return build_tiny_model(VLLM_VENV / "cache" / "tiny-llama")


def start_server(
    worker: WorkerConfig,
    log_dir: Path,
    *,
    in_process_worker: bool,
    speculative_extra: dict[str, object] | None = None,
    ready_timeout_s: float = 150.0,
) -> Iterator[RunningServer]:
    """Run the tiny CPU worker (ngram, k_max 4, table [[1, 8, 4]] unless overridden, the gearshift plugin).

    ``in_process_worker=False`` is vLLM's default layout (API server, EngineCore, model worker: three
    processes); True puts the model worker inside EngineCore and starts faster.
    """
    cpu = CpuOptions(in_process_worker=in_process_worker)
    plan = tiny_plan(worker, cpu=cpu, speculative_extra=speculative_extra)
    env = {"GEARSHIFT_CONTROL_TOKEN": CONTROL_TOKEN, "GEARSHIFT_SPEC_POLL_SECONDS": "0.25"}
    try:
        with running_server(
            plan, url=worker.url, log_path=log_dir / "vllm.log", extra_env=env, ready_timeout_s=ready_timeout_s
        ) as server:
            yield server
    except ServerStartError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A real vLLM CPU server with run-time control in vLLM's default process layout, started once per session
    and shared by test_real_engine.py and test_real_stack.py. Each module leaves it on its start-up schedule
    (test_real_stack.py ends with a lease expiry; test_real_engine.py's first test checks that state)."""
    worker = tiny_worker(port=free_port(), model_dir=tiny_model_dir)
    yield from start_server(worker, tmp_path_factory.mktemp("vllm"), in_process_worker=False)
