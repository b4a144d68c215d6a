"""Run a real vLLM CPU server with the gearshift plugin as a child process: for the real-engine test and
``gearshift worker measure``. Runs vLLM from the separate virtualenv built by ``scripts/vllm-env.sh``."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from fleet.config import DrafterConfig, WorkerConfig, WorkerKind
from workers.vllm.launcher import CpuOptions, Entrypoint, LaunchPlan, build_launch

REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = REPO_ROOT / ".venv-vllm"
VLLM_PYTHON = VLLM_VENV / "bin" / "python"

TINY_K_MAX = 4
TINY_MAX_NUM_SEQS = 8
NGRAM_LOOKUP = {"prompt_lookup_min": 2, "prompt_lookup_max": 4}
"""Short n-grams match early in a random model's repetitive output, so drafts start after a few tokens."""


class ServerStartError(RuntimeError):
    """The vLLM server died or did not become healthy in time; the message carries its log's tail."""


@dataclass(frozen=True)
class RunningServer:
    url: str
    pid: int
    ready_after_s: float
    """Seconds from spawning the process to the first healthy ``/health``."""
    log_path: Path


def tiny_worker(
    *, port: int, model_dir: Path, worker_id: str = "tiny-0", max_num_seqs: int = TINY_MAX_NUM_SEQS
) -> WorkerConfig:
    """Fleet entry of a CPU worker serving the tiny random Llama as ``tiny`` with ngram speculation."""
    return WorkerConfig(
        id=worker_id,
        url=f"http://127.0.0.1:{port}",
        model="tiny",
        kind=WorkerKind.VLLM,
        weights=str(model_dir),
        gpus=1,
        usd_per_gpu_hour=0.0,
        drafter=DrafterConfig(name="ngram", method="ngram", k_max=TINY_K_MAX),
        max_num_seqs=max_num_seqs,
        tensor_parallel_size=1,
    )


def tiny_plan(
    worker: WorkerConfig,
    *,
    cpu: CpuOptions | None = None,
    speculative_extra: Mapping[str, Any] | None = None,
    drafter: bool = True,
) -> LaunchPlan:
    """The CPU command line of a ``tiny_worker``; ``speculative_extra`` overrides speculative-config keys;
    ``drafter=False`` starts it without speculation (the drafter-free gear)."""
    return build_launch(
        worker,
        entrypoint=Entrypoint.MODULE,
        python=str(VLLM_PYTHON),
        cpu=cpu or CpuOptions(),
        speculative_extra={**NGRAM_LOOKUP, **(speculative_extra or {})},
        drafter=drafter,
    )


def build_tiny_model(out: Path, *, timeout_s: float = 120.0) -> Path:
    """Build the tiny model with the vLLM virtualenv's torch/transformers (reused when up to date)."""
    subprocess.run(
        [str(VLLM_PYTHON), "-m", "workers.vllm.tiny_model", str(out)],
        check=True,
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=timeout_s,
    )
    return out


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_healthy(url: str, proc: subprocess.Popen[bytes], *, timeout_s: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ServerStartError(f"vLLM exited with {proc.returncode} while starting:\n{_tail(log_path)}")
            try:
                if client.get(f"{url}/health").status_code == httpx.codes.OK:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.25)
    raise ServerStartError(f"vLLM was not healthy after {timeout_s:.0f} s:\n{_tail(log_path)}")


def stop_group(proc: subprocess.Popen[bytes], *, timeout_s: float) -> None:
    """SIGTERM the server's process group (API server, EngineCore, worker), then SIGKILL what is left."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout_s)
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # children that outlived the API server
    if proc.poll() is None:
        proc.wait(timeout=timeout_s)


@dataclass(frozen=True)
class ServerSpec:
    """One server for ``running_servers``: its command, URL, log and environment over the plan's."""

    plan: LaunchPlan
    url: str
    log_path: Path
    extra_env: Mapping[str, str] = field(default_factory=dict)


def _spawn(spec: ServerSpec) -> subprocess.Popen[bytes]:
    if not VLLM_PYTHON.exists():
        raise ServerStartError(f"{VLLM_PYTHON} is missing: run scripts/vllm-env.sh first")
    env = {**os.environ, **spec.plan.env, **spec.extra_env}
    with spec.log_path.open("wb") as log:
        return subprocess.Popen(
            list(spec.plan.argv), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT, start_new_session=True
        )


@contextmanager
def running_servers(
    specs: Mapping[str, ServerSpec], *, ready_timeout_s: float = 150.0, stop_timeout_s: float = 20.0
) -> Iterator[dict[str, RunningServer]]:
    """Start every server of ``specs`` at once, each in its own process group, wait until each answers
    ``/health`` (``ready_timeout_s`` from the start, for each), and stop every group on exit. Starting them
    together costs the longest start-up, not their sum."""
    started = time.monotonic()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, spec in specs.items():
            procs[name] = _spawn(spec)
        servers = {}
        for name, spec in specs.items():
            left = max(1.0, ready_timeout_s - (time.monotonic() - started))
            wait_healthy(spec.url, procs[name], timeout_s=left, log_path=spec.log_path)
            servers[name] = RunningServer(
                url=spec.url, pid=procs[name].pid, ready_after_s=time.monotonic() - started, log_path=spec.log_path
            )
        yield servers
    finally:
        for proc in procs.values():  # every group told first, so they stop together
            if proc.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            stop_group(proc, timeout_s=stop_timeout_s)


@contextmanager
def running_server(
    plan: LaunchPlan,
    *,
    url: str,
    log_path: Path,
    ready_timeout_s: float = 150.0,
    stop_timeout_s: float = 20.0,
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[RunningServer]:
    """Start ``plan`` in its own process group, wait for ``/health``, and stop the whole group on exit."""
    spec = ServerSpec(plan, url, log_path, extra_env or {})
    with running_servers({"": spec}, ready_timeout_s=ready_timeout_s, stop_timeout_s=stop_timeout_s) as servers:
        yield servers[""]
