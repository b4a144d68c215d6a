"""The gateway-cost benchmark: every target side by side in one invocation, on the same upstream.

Placement (2 cores): each proxy runs alone on the first CPU; wrk, the fake upstream, the first-chunk client and
Redis share the second. Each target on Redis has a redis-server of its own, so the commands counted in its runs are
its own (an idle target's background loops would count in another's runs on a shared one). Targets are measured
interleaved (for each mode and concurrency, every target in turn) so slow drift of the machine affects all of them
alike. Each target gets a short warm-up first.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Literal

from bench.gateway import profile as profiling
from bench.gateway.commands import Monitor, redis_commands
from bench.gateway.targets import Target, TargetLauncher, UpstreamLauncher
from bench.gateway.ttfc import FirstChunkResult
from bench.gateway.wrk import WrkResult, chat_body, run_wrk, write_script
from bench.procs import Proc, ProcessFailed, available_cpus, pinned, process_cpu_s, python_module, start_redis

Mode = Literal["json", "stream"]
MODES: tuple[Mode, ...] = ("json", "stream")


@dataclass(frozen=True)
class GatewayBenchConfig:
    concurrencies: tuple[int, ...] = (1, 16, 64, 256)
    duration_s: float = 10.0
    """Seconds of each wrk run."""
    warmup_s: float = 2.0
    ttfc_duration_s: float = 3.0
    profile_s: float = 8.0
    """Seconds of the py-spy run per profiled target (0 turns profiling off)."""
    profile_targets: tuple[str, ...] = ("gearshift-memory", "gearshift-redis", "passthrough")
    repeat: int = 1
    """Rounds of the whole measurement; each round runs every target once per (mode, concurrency), so targets
    are interleaved in time and share the machine's drift. Reported figures are per-field medians."""
    command_mix_s: float = 3.0
    """Seconds of the untimed run per Redis target and concurrency (c=1 and the highest) whose commands ``MONITOR``
    names (0 turns it off)."""


@dataclass(frozen=True)
class Placement:
    proxy_cpu: int | None
    load_cpu: int | None

    def describe(self) -> str:
        if self.proxy_cpu is None:
            return "no pinning (fewer than 2 CPUs available): every process shares the CPUs"
        return (
            f"each proxy alone on CPU {self.proxy_cpu} (`taskset -c {self.proxy_cpu}`); wrk (1 thread), the fake "
            f"upstream, the first-chunk client and redis-server on CPU {self.load_cpu}"
        )


@dataclass(frozen=True)
class Measurement:
    target: str
    mode: Mode
    concurrency: int
    wrk: WrkResult
    cpu_s: float | None = None
    """CPU seconds (user + system) the proxy process used during the wrk run; None for the direct upstream."""
    redis_commands: int | None = None
    """Redis scripts and transactions (``bench.gateway.commands.redis_commands``) during the wrk run, for a target on
    Redis (its own redis-server); None for the others."""

    @property
    def redis_commands_per_request(self) -> float | None:
        if self.redis_commands is None or self.wrk.requests <= 0:
            return None
        return self.redis_commands / self.wrk.requests

    @property
    def cpu_us_per_request(self) -> float | None:
        """The proxy's CPU cost of one request, microseconds."""
        if self.cpu_s is None or self.wrk.requests <= 0:
            return None
        return self.cpu_s * 1e6 / self.wrk.requests


@dataclass(frozen=True)
class CommandMix:
    """The top-level commands one Redis target sent during an untimed json run at ``concurrency``, by name
    (``bench.gateway.commands.Monitor``: ``evalsha:<script>`` for a script call)."""

    target: str
    concurrency: int
    requests: int
    counts: dict[str, int]

    def per_request(self, name: str) -> float | None:
        return self.counts.get(name, 0) / self.requests if self.requests > 0 else None

    @property
    def total_per_request(self) -> float | None:
        return sum(self.counts.values()) / self.requests if self.requests > 0 else None


@dataclass
class GatewayBenchResult:
    placement: Placement
    targets: list[tuple[str, str]]
    """``(name, note)`` of every target measured, direct first."""
    measurements: list[Measurement] = field(default_factory=list)
    first_chunk: dict[str, FirstChunkResult] = field(default_factory=dict)
    profiles: list[profiling.ProfileSummary] = field(default_factory=list)
    command_mix: list[CommandMix] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    """Targets that could not be started or measured, with the reason."""
    config: GatewayBenchConfig = field(default_factory=GatewayBenchConfig)

    def get(self, target: str, mode: Mode, concurrency: int) -> WrkResult | None:
        m = self.measurement(target, mode, concurrency)
        return m.wrk if m is not None else None

    def rounds(self, target: str, mode: Mode, concurrency: int) -> list[Measurement]:
        """Every round's measurement of one cell, in the order they ran."""
        return [m for m in self.measurements if (m.target, m.mode, m.concurrency) == (target, mode, concurrency)]

    def measurement(self, target: str, mode: Mode, concurrency: int) -> Measurement | None:
        """The cell's per-field median over its rounds (the one measurement when there was one round)."""
        rounds = self.rounds(target, mode, concurrency)
        if not rounds:
            return None
        if len(rounds) == 1:
            return rounds[0]
        wrks = [m.wrk for m in rounds]
        cpu = [m.cpu_s for m in rounds if m.cpu_s is not None]
        cmds = [m.redis_commands for m in rounds if m.redis_commands is not None]
        wrk = WrkResult(
            requests=round(median([w.requests for w in wrks])),
            duration_s=median([w.duration_s for w in wrks]),
            errors=sum(w.errors for w in wrks),
            p50_us=median([w.p50_us for w in wrks]),
            p90_us=median([w.p90_us for w in wrks]),
            p99_us=median([w.p99_us for w in wrks]),
            mean_us=median([w.mean_us for w in wrks]),
        )
        return Measurement(
            target, mode, concurrency, wrk, median(cpu) if cpu else None, round(median(cmds)) if cmds else None
        )

    def spread(self, target: str, mode: Mode, concurrency: int) -> float | None:
        """(max − min) / median of the cell's requests/s over its rounds; None with fewer than two rounds."""
        rates = [m.wrk.requests_per_s for m in self.rounds(target, mode, concurrency)]
        if len(rates) < 2 or median(rates) <= 0:
            return None
        return (max(rates) - min(rates)) / median(rates)


Progress = Callable[[str], None]


def tree_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` and its live descendants (``--workers N``'s processes)."""
    own = process_cpu_s(pid)
    if own is None:
        return None
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return own + sum(tree_cpu_s(int(child)) or 0.0 for child in children)


def placement() -> Placement:
    cpus = available_cpus()
    if len(cpus) < 2:
        return Placement(None, None)
    return Placement(proxy_cpu=cpus[0], load_cpu=cpus[1])


def _first_chunk(target: Target, *, duration_s: float, cpu: int | None) -> FirstChunkResult:
    argv = python_module(
        "bench.gateway.ttfc",
        target.chat_url,
        "--body",
        chat_body(stream=True),
        "--api-key",
        target.api_key or "",
        "--duration-s",
        str(duration_s),
    )
    done = subprocess.run(pinned(argv, cpu), capture_output=True, text=True, timeout=duration_s + 60, check=False)
    if done.returncode != 0:
        raise ProcessFailed(f"first-chunk client against {target.name}: {done.stderr[-2000:]}")
    return FirstChunkResult(**json.loads(done.stdout.strip().splitlines()[-1]))


def on_redis(name: str) -> bool:
    """A target whose store is Redis (``gearshift-redis``, ``gearshift-redis-2proc``, ``gearshift-redis@REV``)."""
    return "redis" in name


def _start_targets(
    launchers: Sequence[TargetLauncher],
    upstream: Target,
    redis: Callable[[str], Proc],
    result: GatewayBenchResult,
    *,
    cpu: int | None,
    logs: Path,
    progress: Progress,
) -> list[Target]:
    """Start every launcher's proxy; ``redis(name)`` gives the redis-server of the target ``name``."""
    started = []
    for launcher in launchers:
        progress(f"starting {launcher.name}")
        try:
            url = redis(launcher.name).url
            target = launcher.launch(upstream=upstream.base_url, redis_url=url, cpu=cpu, log_dir=logs)
        except (ProcessFailed, OSError, ValueError) as exc:
            result.failures.append(f"{launcher.name}: could not start: {exc}")
            continue
        started.append(target)
        result.targets.append((target.name, target.note))
    return started


def run(
    launchers: Sequence[TargetLauncher],
    *,
    config: GatewayBenchConfig,
    progress: Progress = lambda _: None,
    work_dir: Path | None = None,
) -> GatewayBenchResult:
    """Start the upstream, Redis and every launcher's proxy; measure them all; stop everything."""
    place = placement()
    work = work_dir or Path(tempfile.mkdtemp(prefix="gearshift-bench-gw-"))
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    started: list[Target] = []
    servers: dict[str, Proc] = {}
    """redis-servers by target name ("" for the one the targets not on Redis are given)."""

    def redis(name: str) -> Proc:
        key = name if on_redis(name) else ""
        if key not in servers:
            servers[key] = start_redis(cpu=place.load_cpu, log_dir=logs / f"redis-{key or 'shared'}")
        return servers[key]

    try:
        upstream = UpstreamLauncher().launch(cpu=place.load_cpu, log_dir=logs)
        started.append(upstream)
        result = GatewayBenchResult(placement=place, targets=[(upstream.name, upstream.note)], config=config)
        started += _start_targets(launchers, upstream, redis, result, cpu=place.proxy_cpu, logs=logs, progress=progress)
        redis_of = {name: proc for name, proc in servers.items() if name}
        driver = _Driver(result, config, write_script(work), place.load_cpu, progress, redis_of)
        answering = driver.warm_up(started)
        driver.measure(answering)
        driver.first_chunks(answering)
        driver.command_mixes(answering)
        for target in answering:
            if target.name in config.profile_targets and config.profile_s > 0:
                driver.profile(target, work)
        return result
    finally:
        for target in reversed(started):
            target.stop()
        for proc in servers.values():
            proc.stop()


@dataclass
class _Driver:
    """Drives wrk and the first-chunk client from the load CPU and files results and failures."""

    result: GatewayBenchResult
    config: GatewayBenchConfig
    script: Path
    cpu: int | None
    progress: Progress
    redis_of: dict[str, Proc] = field(default_factory=dict)
    """Each Redis target's own redis-server, by target name."""

    def load(self, target: Target, mode: Mode, connections: int, seconds: float) -> WrkResult:
        body = chat_body(stream=mode == "stream")
        return run_wrk(
            target.chat_url,
            script=self.script,
            body=body,
            connections=connections,
            duration_s=seconds,
            api_key=target.api_key,
            cpu=self.cpu,
        )

    def warm_up(self, targets: list[Target]) -> list[Target]:
        """Warm every target up (connections, pools, caches); returns those that answered."""
        ok = []
        for target in targets:
            self.progress(f"warming up {target.name}")
            try:
                for mode in MODES:
                    self.load(target, mode, 16, self.config.warmup_s)
            except ProcessFailed as exc:
                self.result.failures.append(f"{target.name}: warm-up failed: {exc}")
                continue
            ok.append(target)
        return ok

    def measure(self, targets: list[Target]) -> None:
        for n in range(self.config.repeat):
            self.measure_round(targets, f"round {n + 1}/{self.config.repeat}: " if self.config.repeat > 1 else "")

    def measure_round(self, targets: list[Target], label: str) -> None:
        for mode in MODES:
            for c in self.config.concurrencies:
                for target in targets:
                    self.progress(f"{label}{mode} c={c} → {target.name}")
                    pid = target.child.pid if target.child is not None and target.name != "direct" else None
                    before = tree_cpu_s(pid) if pid is not None else None
                    redis = self.redis_of.get(target.name)
                    commands_before = redis_commands(redis.url) if redis is not None else 0
                    try:
                        wrk = self.load(target, mode, c, self.config.duration_s)
                    except ProcessFailed as exc:
                        self.result.failures.append(f"{target.name}: {mode} c={c}: {exc}")
                        continue
                    after = tree_cpu_s(pid) if pid is not None else None
                    cpu_s = after - before if after is not None and before is not None else None
                    commands = redis_commands(redis.url) - commands_before if redis is not None else None
                    self.result.measurements.append(Measurement(target.name, mode, c, wrk, cpu_s, commands))
                    time.sleep(0.2)  # let the last run's sockets close before the next one starts

    def first_chunks(self, targets: list[Target]) -> None:
        for target in targets:
            self.progress(f"time to first chunk → {target.name}")
            try:
                self.result.first_chunk[target.name] = _first_chunk(
                    target, duration_s=self.config.ttfc_duration_s, cpu=self.cpu
                )
            except (ProcessFailed, subprocess.TimeoutExpired, ValueError) as exc:
                self.result.failures.append(f"{target.name}: first chunk: {exc}")

    def command_mixes(self, targets: list[Target]) -> None:
        """For each target on Redis, an untimed json run at c=1 and at the highest concurrency whose commands
        ``MONITOR`` names (``CommandMix``)."""
        seconds = min(self.config.command_mix_s, max(self.config.duration_s, 1.0))  # no longer than a timed cell
        for target in targets:
            redis = self.redis_of.get(target.name)
            if redis is None or seconds <= 0:
                continue
            for c in sorted({1, max(self.config.concurrencies)}):
                self.progress(f"command mix c={c} → {target.name}")
                try:
                    with Monitor(redis.port) as monitor:
                        wrk = self.load(target, "json", c, seconds)
                except (ProcessFailed, OSError) as exc:
                    self.result.failures.append(f"{target.name}: command mix c={c}: {exc}")
                    continue
                mix = CommandMix(target.name, c, wrk.requests, dict(monitor.counts))
                self.result.command_mix.append(mix)

    def profile(self, target: Target, work: Path, rate_hz: int = 200) -> None:
        """py-spy on ``target`` while wrk drives it at the highest concurrency, half plain, half streaming."""
        if target.child is None:
            return
        self.progress(f"profiling {target.name} with py-spy")
        out = work / f"profile-{target.name}.txt"
        seconds = self.config.profile_s
        try:
            recorder = profiling.record(target.child.pid, duration_s=seconds, out=out, rate_hz=rate_hz)
            for mode in MODES:
                self.load(target, mode, max(self.config.concurrencies), seconds / 2)
            _, err = recorder.communicate(timeout=seconds + 60)
            if not out.exists():
                raise ProcessFailed(f"py-spy: no output: {err.decode(errors='replace')[-1000:]}")
        except (ProcessFailed, OSError, subprocess.TimeoutExpired) as exc:
            self.result.failures.append(f"{target.name}: profiling failed: {exc}")
            return
        summary = profiling.summarise(out.read_text(), target=target.name, expected_samples=round(seconds * rate_hz))
        self.result.profiles.append(summary)
