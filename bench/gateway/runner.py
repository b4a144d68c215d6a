"""The gateway-cost benchmark: every target side by side in one invocation, on the same upstream.

Placement (2 cores): each proxy runs alone on the first CPU; wrk, the fake upstream, the first-chunk client and
Redis share the second. Targets are measured interleaved (for each mode and concurrency, every target in
turn) so slow drift of the machine affects all of them alike. Each target gets a short warm-up first.
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
from bench.gateway.targets import Target, TargetLauncher, UpstreamLauncher
from bench.gateway.ttfc import FirstChunkResult
from bench.gateway.wrk import WrkResult, chat_body, run_wrk, write_script
from bench.procs import ProcessFailed, available_cpus, pinned, process_cpu_s, python_module, start_redis

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
    """Redis scripts and transactions (``redis_commands``) during the wrk run, for a target on the bench's Redis;
    None for the others."""

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


@dataclass
class GatewayBenchResult:
    placement: Placement
    targets: list[tuple[str, str]]
    """``(name, note)`` of every target measured, direct first."""
    measurements: list[Measurement] = field(default_factory=list)
    first_chunk: dict[str, FirstChunkResult] = field(default_factory=dict)
    profiles: list[profiling.ProfileSummary] = field(default_factory=list)
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


_ROUND_TRIP_COMMANDS = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_exec")
"""What the gateway sends Redis on the request path: Lua scripts (admit, settle, ledger append) and transactions.
``INFO commandstats`` also counts every command a script runs inside Redis, so a sum over all commands would count
one EVALSHA as 5-20; plain commands outside scripts (a few per second of background reads) are left out too."""


def redis_commands(url: str) -> int:
    """Scripts and transactions the Redis at ``url`` has run so far (``INFO commandstats``): the gateway's calls."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        stats: dict[str, dict[str, int]] = client.info("commandstats")
    finally:
        client.close()
    return sum(int(stats[k]["calls"]) for k in _ROUND_TRIP_COMMANDS if k in stats)


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


def _start_targets(
    launchers: Sequence[TargetLauncher],
    upstream: Target,
    redis_url: str,
    result: GatewayBenchResult,
    *,
    cpu: int | None,
    logs: Path,
    progress: Progress,
) -> list[Target]:
    started = []
    for launcher in launchers:
        progress(f"starting {launcher.name}")
        try:
            target = launcher.launch(upstream=upstream.base_url, redis_url=redis_url, cpu=cpu, log_dir=logs)
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
    redis_child = None
    try:
        upstream = UpstreamLauncher().launch(cpu=place.load_cpu, log_dir=logs)
        started.append(upstream)
        redis_child = start_redis(cpu=place.load_cpu, log_dir=logs)
        redis_url = redis_child.url
        result = GatewayBenchResult(placement=place, targets=[(upstream.name, upstream.note)], config=config)
        started += _start_targets(
            launchers, upstream, redis_url, result, cpu=place.proxy_cpu, logs=logs, progress=progress
        )
        driver = _Driver(result, config, write_script(work), place.load_cpu, progress, redis_url)
        answering = driver.warm_up(started)
        driver.measure(answering)
        driver.first_chunks(answering)
        for target in answering:
            if target.name in config.profile_targets and config.profile_s > 0:
                driver.profile(target, work)
        return result
    finally:
        for target in reversed(started):
            target.stop()
        if redis_child is not None:
            redis_child.stop()


@dataclass
class _Driver:
    """Drives wrk and the first-chunk client from the load CPU and files results and failures."""

    result: GatewayBenchResult
    config: GatewayBenchConfig
    script: Path
    cpu: int | None
    progress: Progress
    redis_url: str | None = None

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
                    on_redis = self.redis_url is not None and "redis" in target.name
                    commands_before = redis_commands(self.redis_url) if on_redis and self.redis_url else 0
                    try:
                        wrk = self.load(target, mode, c, self.config.duration_s)
                    except ProcessFailed as exc:
                        self.result.failures.append(f"{target.name}: {mode} c={c}: {exc}")
                        continue
                    after = tree_cpu_s(pid) if pid is not None else None
                    cpu_s = after - before if after is not None and before is not None else None
                    commands = redis_commands(self.redis_url) - commands_before if on_redis and self.redis_url else None
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
