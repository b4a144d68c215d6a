"""Root fixtures shared by every test area: a real ``redis-server`` on loopback. Keep this file generic;
area fixtures live in ``tests/<area>/conftest.py``."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._net import free_port, wait_for_port

_START_ATTEMPTS = 3


def _try_start(binary: str, workdir: Path) -> tuple[subprocess.Popen[bytes], int] | None:
    """Start redis-server on a free loopback port with no persistence; None if it did not come up."""
    port = free_port()
    args = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"]
    args += ["--dir", str(workdir), "--protected-mode", "yes", "--loglevel", "warning"]
    with (workdir / f"redis-{port}.log").open("wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    if wait_for_port(port, timeout_s=10.0, alive=lambda: proc.poll() is None):
        return proc, port
    proc.kill()
    proc.wait(timeout=5)
    return None


def _start_redis(binary: str, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Start redis-server, retrying when another process took the probed port first."""
    for _ in range(_START_ATTEMPTS):
        started = _try_start(binary, workdir)
        if started is not None:
            return started
    logs = "\n".join(p.read_text(errors="replace") for p in workdir.glob("redis-*.log"))
    pytest.fail(f"redis-server did not start after {_START_ATTEMPTS} attempts:\n{logs}", pytrace=False)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a real redis-server started for this test session on 127.0.0.1 (stopped at the end).
    Tests share it: isolate with a unique key prefix."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(
            "redis-server is not installed: run scripts/bootstrap.sh (it installs Debian's redis-server) "
            "or `apt-get install redis-server`",
            pytrace=False,
        )
    proc, port = _start_redis(binary, tmp_path_factory.mktemp("redis"))
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
