"""The vLLM server process of a supervisor (``workers.vllm.supervisor``) or a headless node's follower
(``workers.vllm.follower``): one process at a time, started from a ``LaunchPlan`` in its own process group with its
output in a log file, and stopped as a whole group (API server, EngineCore, workers). Imports no vLLM."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from workers.vllm.cpu_server import REPO_ROOT, stop_group
from workers.vllm.launcher import LaunchPlan


def log_path(log_dir: Path, number: int, *, drafter: bool) -> Path:
    """The log of the ``number``-th start (restart or start count) in the given mode."""
    return log_dir / f"vllm-{number}-{'drafter' if drafter else 'drafter-free'}.log"


class VllmProcess:
    """The one vLLM process a supervisor or a follower runs; ``popen`` is None while none runs."""

    def __init__(self) -> None:
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self, plan: LaunchPlan, *, log: Path) -> subprocess.Popen[bytes]:
        """Start ``plan`` (its env added to this process's) from the repository root, its output to ``log``."""
        with log.open("wb") as out:
            self.popen = subprocess.Popen(
                list(plan.argv), stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **plan.env},
                cwd=REPO_ROOT, start_new_session=True,
            )  # fmt: skip
        return self.popen

    def stop(self, *, timeout_s: float) -> None:
        """Stop the process group (SIGTERM, then SIGKILL after ``timeout_s`` seconds); blocking."""
        if self.popen is not None:
            stop_group(self.popen, timeout_s=timeout_s)
            self.popen = None

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None
