"""Run a probe script in vLLM's own environment (``.venv-vllm``) and read its answer: the last line it prints, as
JSON. A failing probe fails the test with the end of its stderr."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from workers.vllm.cpu_server import REPO_ROOT, VLLM_PYTHON


def run_probe(
    script: Path, *, request: object = None, env: dict[str, str] | None = None, timeout_s: float = 180
) -> dict[str, Any]:
    """``script``'s answer; ``request`` (if any) goes to its stdin as JSON, ``env`` over the test's environment."""
    result = subprocess.run(
        [str(VLLM_PYTHON), str(script)],
        input=None if request is None else json.dumps(request),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {}), "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"},
        timeout=timeout_s,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"{script.name} failed ({result.returncode}):\n{result.stderr[-4000:]}", pytrace=False)
    answer: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return answer
