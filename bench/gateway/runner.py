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
from typing import Literal

from bench.gateway import profile as profiling
from bench.gateway.procs import BenchProcessError, available_cpus, pinned, python_module, start_redis
from bench.gateway.targets import Target, TargetLauncher, UpstreamLauncher
from bench.gateway.ttfc import FirstChunkResult
from bench.gateway.wrk import WrkResult, chat_body, run_wrk, write_script

Mode = Literal["json", "stream"]
MODES: tuple[Mode, ...] = ("json", "stream")


@dataclass(frozen=True)
class GatewayBenchConfig:
    concurrencies: tuple[int, ...] = (1, 16, 64)
    duration_s: float = 10.0
    """Seconds of each wrk run."""
    warmup_s: float = 2.0
    ttfc_duration_s: float = 3.0
    profile_s: float = 8.0
    """Seconds of the py-spy run per profiled target (0 turns profiling off)."""
    profile_targets: tuple[str, ...] = ("gearshift", "passthrough")


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
        for m in self.measurements:
            if (m.target, m.mode, m.concurrency) == (target, mode, concurrency):
                return m.wrk
        return None


Progress = Callable[[str], None]


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
        raise BenchProcessError(f"first-chunk client against {target.name}: {done.stderr[-2000:]}")
    return FirstChunkResult(**json.loads(done.stdout.strip().splitlines()[-1]))


def _profile(target: Target, *, config: GatewayBenchConfig, script: Path, cpu: int | None, work: Path) -> list[str]:
    """py-spy on ``target`` while wrk drives it at the highest concurrency, half plain, half streaming."""
    assert target.child is not None
    out = work / f"profile-{target.name}.txt"
    rate = 200
    recorder = profiling.record(target.child.pid, duration_s=config.profile_s, out=out, rate_hz=rate)
    c = max(config.concurrencies)
    for mode in MODES:
        body = chat_body(stream=mode == "stream")
        run_wrk(
            target.chat_url,
            script=script,
            body=body,
            connections=c,
            duration_s=config.profile_s / 2,
            api_key=target.api_key,
            cpu=cpu,
        )
    _, err = recorder.communicate(timeout=config.profile_s + 60)
    if not out.exists():
        raise BenchProcessError(f"py-spy on {target.name}: no output: {err.decode(errors='replace')[-1000:]}")
    return [out.read_text(), str(round(config.profile_s * rate))]


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
    script = write_script(work)
    started: list[Target] = []
    redis_child = None
    try:
        upstream = UpstreamLauncher().launch(cpu=place.load_cpu, log_dir=logs)
        started.append(upstream)
        redis_child, redis_url = start_redis(cpu=place.load_cpu, log_dir=logs)
        result = GatewayBenchResult(placement=place, targets=[(upstream.name, upstream.note)], config=config)
        targets = [upstream]
        for launcher in launchers:
            progress(f"starting {launcher.name}")
            try:
                target = launcher.launch(
                    upstream=upstream.base_url, redis_url=redis_url, cpu=place.proxy_cpu, log_dir=logs
                )
            except (BenchProcessError, OSError, ValueError) as exc:
                result.failures.append(f"{launcher.name}: could not start: {exc}")
                continue
            started.append(target)
            targets.append(target)
            result.targets.append((target.name, target.note))
        _measure_all(targets, result, config=config, script=script, cpu=place.load_cpu, progress=progress)
        for target in targets:
            if target.name in config.profile_targets and config.profile_s > 0 and target.child is not None:
                progress(f"profiling {target.name} with py-spy")
                try:
                    raw, expected = _profile(target, config=config, script=script, cpu=place.load_cpu, work=work)
                    result.profiles.append(profiling.summarise(raw, target=target.name, expected_samples=int(expected)))
                except (BenchProcessError, OSError, subprocess.TimeoutExpired) as exc:
                    result.failures.append(f"{target.name}: profiling failed: {exc}")
        return result
    finally:
        for target in reversed(started):
            target.stop()
        if redis_child is not None:
            redis_child.stop()


def _measure_all(
    targets: list[Target],
    result: GatewayBenchResult,
    *,
    config: GatewayBenchConfig,
    script: Path,
    cpu: int | None,
    progress: Progress,
) -> None:
    broken: set[str] = set()
    for target in targets:
        progress(f"warming up {target.name}")
        for mode in MODES:
            try:
                run_wrk(
                    target.chat_url,
                    script=script,
                    body=chat_body(stream=mode == "stream"),
                    connections=16,
                    duration_s=config.warmup_s,
                    api_key=target.api_key,
                    cpu=cpu,
                )
            except BenchProcessError as exc:
                result.failures.append(f"{target.name}: warm-up failed: {exc}")
                broken.add(target.name)
    for mode in MODES:
        body = chat_body(stream=mode == "stream")
        for c in config.concurrencies:
            for target in targets:
                if target.name in broken:
                    continue
                progress(f"{mode} c={c} → {target.name}")
                try:
                    wrk = run_wrk(
                        target.chat_url,
                        script=script,
                        body=body,
                        connections=c,
                        duration_s=config.duration_s,
                        api_key=target.api_key,
                        cpu=cpu,
                    )
                except BenchProcessError as exc:
                    result.failures.append(f"{target.name}: {mode} c={c}: {exc}")
                    continue
                result.measurements.append(Measurement(target.name, mode, c, wrk))
                time.sleep(0.2)  # let the sockets of the last run close before the next one
    for target in targets:
        if target.name in broken:
            continue
        progress(f"time to first chunk → {target.name}")
        try:
            result.first_chunk[target.name] = _first_chunk(target, duration_s=config.ttfc_duration_s, cpu=cpu)
        except (BenchProcessError, subprocess.TimeoutExpired, ValueError) as exc:
            result.failures.append(f"{target.name}: first chunk: {exc}")
