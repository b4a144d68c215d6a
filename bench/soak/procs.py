"""Child processes for the soak run and the reliability tests: simulated workers (``gearshift sim serve``),
gateways (``gearshift gateway``), controllers (``gearshift controller``) and ``redis-server``.

Every child runs in its own process group with its output in a log file, listens on 127.0.0.1 on a port
chosen at run time, and is waited for by polling (never a fixed sleep). Faults are real signals: ``kill``
(SIGKILL), ``pause``/``resume`` (SIGSTOP/SIGCONT: the kernel still accepts connections, nothing answers),
``terminate`` (SIGTERM, returns the exit status).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_START_ATTEMPTS = 3


class ProcessFailed(RuntimeError):
    """A child failed to start or died early; the message carries the tail of its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (callers retry when they lose the race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gearshift_argv(*args: str) -> list[str]:
    """argv of the ``gearshift`` console script installed beside this interpreter."""
    script = Path(sys.executable).with_name("gearshift")
    exe = str(script) if script.exists() else shutil.which("gearshift")
    if exe is None:
        raise ProcessFailed("the `gearshift` command is not installed (pip install -e .)")
    return [exe, *args]


@dataclass
class Proc:
    """A started child process whose output goes to ``log_path``."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] = field(repr=False)
    url: str = ""
    port: int = 0

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def send(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the child itself (not its group: a SIGKILL must look like a crash of this process)."""
        if self.alive():
            os.kill(self.popen.pid, sig)

    def kill(self) -> None:
        """SIGKILL and reap."""
        self.send(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def pause(self) -> None:
        self.send(signal.SIGSTOP)

    def resume(self) -> None:
        self.send(signal.SIGCONT)

    def terminate(self, timeout_s: float = 15.0) -> int:
        """SIGTERM; wait up to ``timeout_s`` for the exit status (SIGKILL after that, returning -9)."""
        if not self.alive():
            return int(self.popen.returncode)
        self.resume()
        self.send(signal.SIGTERM)
        try:
            return int(self.popen.wait(timeout=timeout_s))
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def stop(self) -> None:
        """Make sure the child and its group are gone (cleanup; never raises)."""
        if self.alive():
            try:
                self.resume()
                os.killpg(self.popen.pid, signal.SIGTERM)
                self.popen.wait(timeout=5)
            except (subprocess.TimeoutExpired, ProcessLookupError, PermissionError):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=5)


def spawn(name: str, argv: Sequence[str], *, log_dir: Path, env: Mapping[str, str] | None = None) -> Proc:
    """Start ``argv`` in its own process group; stdout and stderr go to ``log_dir/<name>.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    return Proc(name=name, argv=list(argv), log_path=log_path, popen=popen)


def wait_until(check: Callable[[], bool], *, timeout_s: float, proc: Proc | None = None, what: str = "") -> bool:
    """Poll ``check`` every 20 ms until true (True), ``timeout_s`` passes or ``proc`` dies (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            return False
        if check():
            return True
        time.sleep(0.02)
    return False


def http_ok(url: str, *, timeout_s: float = 1.0) -> bool:
    """True when GET ``url`` answers 2xx."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return 200 <= int(resp.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


Launch = Callable[[int], tuple[list[str], Mapping[str, str] | None]]
"""Port → (argv, extra environment) of a server child."""


def _start_http(name: str, launch: Launch, *, log_dir: Path, ready_path: str, timeout_s: float) -> Proc:
    """Start a server on a free port (retrying a lost port race) and wait until ``ready_path`` answers 2xx."""
    for _ in range(_START_ATTEMPTS):
        port = free_port()
        argv, env = launch(port)
        proc = spawn(name, argv, log_dir=log_dir, env=env)
        proc.port, proc.url = port, f"http://127.0.0.1:{port}"
        if wait_until(functools.partial(http_ok, proc.url + ready_path), timeout_s=timeout_s, proc=proc):
            return proc
        tail = proc.log_tail()
        proc.stop()
        if "address already in use" not in tail.lower():
            raise ProcessFailed(f"{name}: not ready at {proc.url}{ready_path} within {timeout_s} s:\n{tail}")
    raise ProcessFailed(f"{name}: lost the port race {_START_ATTEMPTS} times")


def start_sim(
    worker_id: str,
    *,
    log_dir: Path,
    speedup: float = 1.0,
    model: str = "kimi-k3",
    seed: int = 0,
    extra: Sequence[str] = (),
    timeout_s: float = 30.0,
) -> Proc:
    """A simulated worker process (``gearshift sim serve``), ready when ``/health`` answers."""

    def launch(port: int) -> tuple[list[str], None]:
        args = ["--port", str(port), "--worker-id", worker_id, "--model", model, "--speedup", repr(speedup)]
        return gearshift_argv("sim", "serve", *args, "--seed", str(seed), *extra), None

    return _start_http(f"sim-{worker_id}", launch, log_dir=log_dir, ready_path="/health", timeout_s=timeout_s)


def start_gateway(name: str, *, env: Mapping[str, str], log_dir: Path, timeout_s: float = 30.0) -> Proc:
    """A gateway process (``gearshift gateway``; settings from ``env``), ready when ``/healthz`` answers."""

    def launch(port: int) -> tuple[list[str], Mapping[str, str]]:
        return gearshift_argv("gateway"), {**env, "GEARSHIFT_PORT": str(port)}

    return _start_http(name, launch, log_dir=log_dir, ready_path="/healthz", timeout_s=timeout_s)


def start_controller(name: str, *, env: Mapping[str, str], log_dir: Path) -> Proc:
    """A controller process (``gearshift controller``; settings from ``env``). Not waited for."""
    return spawn(name, gearshift_argv("controller"), log_dir=log_dir, env=env)


def redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(*, log_dir: Path, port: int | None = None, persist: bool = False, name: str = "redis") -> Proc:
    """A ``redis-server`` on ``port`` (a free one when None). ``persist`` keeps an append-only file in
    ``log_dir`` (fsync on every write) so a restart on the same port and directory keeps the data."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise ProcessFailed("redis-server is not installed (scripts/bootstrap.sh installs it)")
    for _ in range(_START_ATTEMPTS if port is None else 1):
        chosen = port or free_port()
        argv = [binary, "--bind", "127.0.0.1", "--port", str(chosen), "--save", "", "--dir", str(log_dir)]
        argv += ["--appendonly", "yes", "--appendfsync", "always"] if persist else ["--appendonly", "no"]
        proc = spawn(name, argv, log_dir=log_dir)
        proc.port, proc.url = chosen, f"redis://127.0.0.1:{chosen}/0"
        if wait_until(functools.partial(redis_ping, chosen), timeout_s=10.0, proc=proc):
            return proc
        proc.stop()
    raise ProcessFailed(f"{name}: redis-server did not answer PING")
