"""Child processes for the benchmarks and the tests: loopback ports, a handle on a started process,
``redis-server`` (alone or as a Redis Cluster), and gearshift's own commands (``gearshift sim serve``,
``gearshift gateway``, ``gearshift controller``).

Every child runs in its own process group with its output in a log file, listens on 127.0.0.1 on a port
chosen at run time, and is waited for by polling with a deadline (never a fixed sleep). Faults are real
signals: ``kill`` (SIGKILL), ``pause``/``resume`` (SIGSTOP/SIGCONT: the kernel still accepts connections,
nothing answers), ``terminate`` (SIGTERM, returns the exit status).
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

from fleet.ports import free_port as free_port  # re-exported: the tests and benches take it from here

_START_ATTEMPTS = 3
_POLL_S = 0.02


class ProcessFailed(RuntimeError):
    """A child (or a tool the bench runs) failed to start, died early or gave no usable output; the message
    carries the tail of its log."""


def port_open(port: int) -> bool:
    """True when something accepts TCP connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def wait_until(check: Callable[[], bool], *, timeout_s: float, alive: Callable[[], bool] | None = None) -> bool:
    """Poll ``check`` every 20 ms: True once it holds; False after ``timeout_s`` seconds or as soon as
    ``alive()`` says the process being waited for died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            return False
        if check():
            return True
        time.sleep(_POLL_S)
    return False


def wait_for_port(port: int, *, timeout_s: float = 10.0, alive: Callable[[], bool] | None = None) -> bool:
    """Poll until something accepts connections on 127.0.0.1:``port`` (see ``wait_until``)."""
    return wait_until(functools.partial(port_open, port), timeout_s=timeout_s, alive=alive)


def http_ok(url: str, *, timeout_s: float = 1.0) -> bool:
    """True when GET ``url`` answers 2xx."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return 200 <= int(resp.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def http_answers(url: str, *, headers: Mapping[str, str] | None = None, timeout_s: float = 1.0) -> bool:
    """True when GET ``url`` gets any answer below 500 (a 401 or 404 still means the server is up)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=dict(headers or {})), timeout=timeout_s) as r:
            return int(r.status) < 500
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except (urllib.error.URLError, OSError, ValueError):
        return False


def available_cpus() -> list[int]:
    """CPUs this process may run on, sorted."""
    return sorted(os.sched_getaffinity(0))


def pinned(argv: Sequence[str], cpu: int | None) -> list[str]:
    """``argv`` run under ``taskset -c cpu`` (unchanged when ``cpu`` is None or taskset is missing)."""
    if cpu is None or shutil.which("taskset") is None:
        return list(argv)
    return ["taskset", "-c", str(cpu), *argv]


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds that process ``pid`` (all its threads) has used so far; None when unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces; fields after it are fixed
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Proc:
    """A started child process whose output goes to ``log_path``; ``url`` and ``port`` are set for servers."""

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

    def stop(self, timeout_s: float = 5.0) -> None:
        """Make sure the child and its group are gone: SIGTERM, SIGKILL after ``timeout_s`` (never raises)."""
        if self.alive():
            try:
                self.resume()
                os.killpg(self.popen.pid, signal.SIGTERM)
                self.popen.wait(timeout=timeout_s)
            except (subprocess.TimeoutExpired, ProcessLookupError, PermissionError):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=timeout_s)


def spawn(
    name: str, argv: Sequence[str], *, log_dir: Path, env: Mapping[str, str] | None = None, cpu: int | None = None
) -> Proc:
    """Start ``argv`` (pinned to ``cpu`` when given) in its own process group, with this environment plus
    ``env``; stdout and stderr go to ``log_dir/<name>.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    full = pinned(argv, cpu)
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            full,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    return Proc(name=name, argv=full, log_path=log_path, popen=popen)


def wait_http_ready(proc: Proc, url: str, *, timeout_s: float = 30.0, headers: Mapping[str, str] | None = None) -> None:
    """Poll ``url`` until it answers below 500; ProcessFailed when ``proc`` dies or ``timeout_s`` passes."""
    ready = functools.partial(http_answers, url, headers=headers)
    if wait_until(ready, timeout_s=timeout_s, alive=proc.alive):
        return
    if not proc.alive():
        raise ProcessFailed(f"{proc.name}: exited with {proc.popen.returncode}:\n{proc.log_tail()}")
    raise ProcessFailed(f"{proc.name}: not ready at {url} after {timeout_s} s:\n{proc.log_tail()}")


def python_module(module: str, *args: str) -> list[str]:
    """argv running ``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def gearshift_argv(*args: str) -> list[str]:
    """argv of the ``gearshift`` console script installed beside this interpreter."""
    script = Path(sys.executable).with_name("gearshift")
    exe = str(script) if script.exists() else shutil.which("gearshift")
    if exe is None:
        raise ProcessFailed("the `gearshift` command is not installed (pip install -e .)")
    return [exe, *args]


Launch = Callable[[int], tuple[list[str], Mapping[str, str] | None]]
"""Port → (argv, extra environment) of a server child."""


def _start_http(name: str, launch: Launch, *, log_dir: Path, ready_path: str, timeout_s: float) -> Proc:
    """Start a server on a free port (retrying a lost port race) and wait until ``ready_path`` answers 2xx."""
    for _ in range(_START_ATTEMPTS):
        port = free_port()
        argv, env = launch(port)
        proc = spawn(name, argv, log_dir=log_dir, env=env)
        proc.port, proc.url = port, f"http://127.0.0.1:{port}"
        if wait_until(functools.partial(http_ok, proc.url + ready_path), timeout_s=timeout_s, alive=proc.alive):
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
    env: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
) -> Proc:
    """A simulated worker process (``gearshift sim serve``; ``env`` added to this environment), ready when
    ``/health`` answers."""

    def launch(port: int) -> tuple[list[str], Mapping[str, str] | None]:
        args = ["--port", str(port), "--worker-id", worker_id, "--model", model, "--speedup", repr(speedup)]
        return gearshift_argv("sim", "serve", *args, "--seed", str(seed), *extra), env

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
    """True when a Redis server on 127.0.0.1:``port`` answers PING."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(
    *, log_dir: Path, port: int | None = None, persist: bool = False, name: str = "redis", cpu: int | None = None
) -> Proc:
    """A ``redis-server`` on ``port`` (a free one when None, retrying a lost port race), pinned to ``cpu``
    when given; ``proc.url`` is its ``redis://`` URL. ``persist`` keeps an append-only file in ``log_dir``
    (fsync on every write) so a restart on the same port and directory keeps the data."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise ProcessFailed("redis-server is not installed (scripts/bootstrap.sh installs it)")
    for _ in range(_START_ATTEMPTS if port is None else 1):
        chosen = port or free_port()
        argv = [binary, "--bind", "127.0.0.1", "--port", str(chosen), "--save", "", "--dir", str(log_dir)]
        argv += ["--appendonly", "yes", "--appendfsync", "always"] if persist else ["--appendonly", "no"]
        proc = spawn(name, argv, log_dir=log_dir, cpu=cpu)
        proc.port, proc.url = chosen, f"redis://127.0.0.1:{chosen}/0"
        if wait_until(functools.partial(redis_ping, chosen), timeout_s=10.0, alive=proc.alive):
            return proc
        proc.stop()
    raise ProcessFailed(f"{name}: redis-server did not answer PING:\n{proc.log_tail()}")


def _redis_info(port: int, command: bytes) -> bytes:
    """The raw reply of an INFO-like ``command`` from 127.0.0.1:``port`` (b"" when it does not answer)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(command + b"\r\n")
            return sock.recv(65536)
    except OSError:
        return b""


def redis_cluster_ok(port: int) -> bool:
    """True when the Redis Cluster node on 127.0.0.1:``port`` reports ``cluster_state:ok`` and, if it is a
    replica, has finished its first sync with its master (until then it could not take over)."""
    if b"cluster_state:ok" not in _redis_info(port, b"CLUSTER INFO"):
        return False
    replication = _redis_info(port, b"INFO replication")
    return b"role:master" in replication or b"master_link_status:up" in replication


_CLUSTER_BUS_OFFSET = 10_000
"""A cluster node also listens on its port + 10 000 (the cluster bus), so its port must be at most 55 535."""


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_cluster_port(*, attempts: int = 200) -> int:
    """A free port on 127.0.0.1 whose cluster-bus port (+10 000) is free too."""
    for _ in range(attempts):
        port = free_port()
        if port + _CLUSTER_BUS_OFFSET <= 65_535 and _port_free(port + _CLUSTER_BUS_OFFSET):
            return port
    raise ProcessFailed(f"no free port pair (port, port + {_CLUSTER_BUS_OFFSET}) in {attempts} attempts")


@dataclass
class RedisCluster:
    """A Redis Cluster on loopback: ``nodes`` (masters first, then replicas); ``url`` names the first node."""

    nodes: list[Proc]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def stop(self, timeout_s: float = 10.0) -> None:
        for node in self.nodes:
            node.stop(timeout_s=timeout_s)


def _lost_port(proc: Proc, log_offset: int) -> bool:
    """True when ``proc`` logged, after byte ``log_offset`` of its log, that its port was taken."""
    try:
        with proc.log_path.open("rb") as log:
            log.seek(log_offset)
            return b"address already in use" in log.read().lower()
    except OSError:
        return False


def _start_cluster_node(i: int, *, binary: str, log_dir: Path, pick_port: Callable[[], int]) -> Proc:
    """Cluster node ``i`` on a port from ``pick_port``, answering PING; on a fresh port again when another process
    took its port (or its bus port) between the pick and redis-server's bind."""
    node_dir = log_dir / f"node-{i}"
    node_dir.mkdir(parents=True, exist_ok=True)
    name = f"redis-node-{i}"
    for _ in range(_START_ATTEMPTS):
        port = pick_port()
        argv = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"]
        argv += ["--dir", str(node_dir), "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        argv += ["--cluster-node-timeout", "2000"]
        log_path = log_dir / f"{name}.log"
        offset = log_path.stat().st_size if log_path.exists() else 0  # spawn appends: read this attempt's lines
        proc = spawn(name, argv, log_dir=log_dir)
        proc.port, proc.url = port, f"redis://127.0.0.1:{port}/0"
        if wait_until(functools.partial(redis_ping, port), timeout_s=10.0, alive=proc.alive):
            return proc
        proc.stop()
        if not _lost_port(proc, offset):
            raise ProcessFailed(f"{name}: redis-server did not answer PING:\n{proc.log_tail()}")
    raise ProcessFailed(f"{name}: lost the port race {_START_ATTEMPTS} times:\n{proc.log_tail()}")


def start_redis_cluster(
    *,
    log_dir: Path,
    masters: int = 3,
    replicas_per_master: int = 1,
    timeout_s: float = 30.0,
    pick_port: Callable[[], int] = free_cluster_port,
) -> RedisCluster:
    """A real Redis Cluster of ``masters`` masters with ``replicas_per_master`` replicas each, every node a
    ``redis-server --cluster-enabled yes`` on a loopback port from ``pick_port`` (a free one whose bus port is free
    too; a node that loses either to another process before it binds starts again on a fresh one), its node file in
    its own folder under ``log_dir``, joined with ``redis-cli --cluster create`` and waited for until every node
    reports ``cluster_state:ok`` and every replica is in sync. On any failure the nodes started so far are stopped."""
    binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if binary is None or cli is None:
        raise ProcessFailed("redis-server and redis-cli are needed (scripts/bootstrap.sh installs them)")
    cluster = RedisCluster(nodes=[])
    try:
        for i in range(masters * (1 + replicas_per_master)):
            cluster.nodes.append(_start_cluster_node(i, binary=binary, log_dir=log_dir, pick_port=pick_port))
        addresses = [f"127.0.0.1:{node.port}" for node in cluster.nodes]
        create = [cli, "--cluster", "create", *addresses, "--cluster-replicas", str(replicas_per_master)]
        done = subprocess.run(
            [*create, "--cluster-yes"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
        if done.returncode != 0:
            raise ProcessFailed(f"redis-cli --cluster create failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        for node in cluster.nodes:
            if not wait_until(functools.partial(redis_cluster_ok, node.port), timeout_s=timeout_s, alive=node.alive):
                raise ProcessFailed(f"{node.name}: no cluster_state:ok within {timeout_s} s:\n{node.log_tail()}")
    except BaseException:
        cluster.stop()
        raise
    return cluster


@dataclass
class RedisSentinel:
    """A primary, its replicas and the Sentinels watching them (master name ``master``), all on loopback."""

    primary: Proc
    replicas: list[Proc]
    sentinels: list[Proc]
    master: str = "gearshift"

    @property
    def addresses(self) -> str:
        """The Sentinels as ``GEARSHIFT_REDIS_SENTINELS`` takes them: ``host:port,host:port``."""
        return ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)

    def stop(self, timeout_s: float = 10.0) -> None:
        for proc in [*self.sentinels, *self.replicas, self.primary]:
            proc.stop(timeout_s=timeout_s)


def _replica_synced(port: int) -> bool:
    return b"master_link_status:up" in _redis_info(port, b"INFO replication")


def start_redis_sentinel(
    *, log_dir: Path, replicas: int = 1, sentinels: int = 1, down_after_ms: int = 1000, timeout_s: float = 30.0
) -> RedisSentinel:
    """A ``redis-server`` primary with ``replicas`` replicas (``--replicaof``) and ``sentinels`` Sentinels
    (``redis-server <conf> --sentinel``, quorum 1, the primary judged down after ``down_after_ms``), waited for until
    every replica is in sync and every Sentinel knows the replicas. On any failure what was started is stopped."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise ProcessFailed("redis-server is not installed (scripts/bootstrap.sh installs it)")
    primary = start_redis(log_dir=log_dir, name="redis-primary")
    setup = RedisSentinel(primary=primary, replicas=[], sentinels=[])
    try:
        for i in range(replicas):
            node = start_redis(log_dir=log_dir, name=f"redis-replica-{i}")
            setup.replicas.append(node)
            if not _redis_info(node.port, f"REPLICAOF 127.0.0.1 {primary.port}".encode()).startswith(b"+OK"):
                raise ProcessFailed(f"{node.name}: REPLICAOF refused")
        for node in setup.replicas:
            if not wait_until(functools.partial(_replica_synced, node.port), timeout_s=timeout_s, alive=node.alive):
                raise ProcessFailed(f"{node.name}: not in sync with the primary within {timeout_s} s")
        for i in range(sentinels):
            port = free_port()
            conf = log_dir / f"sentinel-{i}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {log_dir}\n"
                f"sentinel monitor {setup.master} 127.0.0.1 {primary.port} 1\n"
                f"sentinel down-after-milliseconds {setup.master} {down_after_ms}\n"
                f"sentinel failover-timeout {setup.master} {max(3 * down_after_ms, 3000)}\n"
            )
            proc = spawn(f"redis-sentinel-{i}", [binary, str(conf), "--sentinel"], log_dir=log_dir)
            proc.port, proc.url = port, f"redis://127.0.0.1:{port}"
            setup.sentinels.append(proc)
            if not wait_until(functools.partial(redis_ping, port), timeout_s=10.0, alive=proc.alive):
                raise ProcessFailed(f"{proc.name}: did not answer PING:\n{proc.log_tail()}")
        command = f"SENTINEL REPLICAS {setup.master}".encode()
        for proc in setup.sentinels:
            known = functools.partial(lambda p: _redis_info(p, command).count(b"127.0.0.1") >= replicas, proc.port)
            if not wait_until(known, timeout_s=timeout_s, alive=proc.alive):
                raise ProcessFailed(f"{proc.name}: did not discover the replicas within {timeout_s} s")
    except BaseException:
        setup.stop()
        raise
    return setup
