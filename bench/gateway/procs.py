"""Child processes of the gateway benchmark: start pinned to a core, wait until ready, stop by pid.

Every server listens on 127.0.0.1 on a port chosen at run time. Readiness is a poll of an HTTP URL with a
deadline (never a fixed sleep).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


class BenchProcessError(RuntimeError):
    """A benchmark child process failed to start or died; the message carries its output tail."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def available_cpus() -> list[int]:
    """CPUs this process may run on, sorted."""
    return sorted(os.sched_getaffinity(0))


def pinned(argv: Sequence[str], cpu: int | None) -> list[str]:
    """``argv`` run under ``taskset -c cpu`` (unchanged when ``cpu`` is None or taskset is missing)."""
    if cpu is None or shutil.which("taskset") is None:
        return list(argv)
    return ["taskset", "-c", str(cpu), *argv]


@dataclass
class Child:
    """A started child process whose output goes to a log file."""

    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM (then SIGKILL after ``timeout_s``) this child and its process group."""
        if not self.alive():
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=timeout_s)
        except ProcessLookupError:
            pass


def start(
    name: str, argv: Sequence[str], *, cpu: int | None, log_dir: Path, env: dict[str, str] | None = None
) -> Child:
    """Start ``argv`` (pinned to ``cpu``) in its own process group, output to ``log_dir/<name>.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    full = pinned(argv, cpu)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            full,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    return Child(name=name, argv=full, log_path=log_path, process=process)


def wait_http_ready(child: Child, url: str, *, timeout_s: float = 30.0, headers: dict[str, str] | None = None) -> None:
    """Poll ``url`` until it answers below 500, the child dies, or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not child.alive():
            raise BenchProcessError(f"{child.name}: exited with {child.process.returncode}:\n{child.log_tail()}")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=1.0) as r:
                if r.status < 500:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    raise BenchProcessError(f"{child.name}: not ready at {url} after {timeout_s} s:\n{child.log_tail()}")


def python_module(module: str, *args: str) -> list[str]:
    """argv running ``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def start_redis(*, cpu: int | None, log_dir: Path) -> tuple[Child, str]:
    """A throw-away ``redis-server`` on a free loopback port (no persistence); returns it and its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise BenchProcessError("redis-server: not installed (scripts/bootstrap.sh installs it)")
    port = free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    child = start("redis", argv, cpu=cpu, log_dir=log_dir)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        if not child.alive():
            raise BenchProcessError(f"redis: exited:\n{child.log_tail()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return child, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    child.stop()
    raise BenchProcessError(f"redis: no PONG on port {port} within 10 s")


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds that process ``pid`` (all its threads) has used so far; None when unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces; fields after it are fixed
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
