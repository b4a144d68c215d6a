"""How fast the lab replays a trace (a benchmark, not a test): a synthetic Poisson trace written to a file, read
back, and replayed under one policy; the figure of merit is simulated seconds per wall second, with the time to
read the trace and to compute the metrics counted in the wall time.

The reference (issue 17): a 1-hour trace at 50 req/s on 4 workers. The request shape is the calibration's
general chat mix, short enough (prompt 512, output 64 tokens) that 4 workers of the default profile are loaded
but not swamped.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import random
import resource
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.policy.policies import LAB_POLICIES, LabPolicy, StaticSchedule
from bench.replay.run import run_one
from bench.replay.scenario import plan_replay
from bench.replay.trace import read_trace
from fleet.perf import load_profile

PROMPT_TOKENS = (256, 768)
OUTPUT_TOKENS = (32, 96)


DIURNAL_SWING = 0.6
"""A diurnal trace's rate swings ±60 % around its mean over a day (lowest at midnight, highest at noon)."""


def diurnal_factor(t_s: float) -> float:
    """Rate multiplier at ``t_s`` seconds into a day: 1 − swing · cos(2π t / 86 400) (mean 1 over a day)."""
    return 1.0 - DIURNAL_SWING * math.cos(2.0 * math.pi * t_s / 86_400.0)


def synthetic_trace(path: Path, *, duration_s: float, rate_per_s: float, seed: int = 7, diurnal: bool = False) -> int:
    """Write a plain JSONL trace of Poisson arrivals (half interactive chat, half batch maths); return its size.
    ``diurnal``: the rate follows ``diurnal_factor`` (thinning a Poisson process at the peak rate), so a day's
    trace has ``rate_per_s`` as its mean."""
    rng = random.Random(seed)
    peak = rate_per_s * (1.0 + DIURNAL_SWING) if diurnal else rate_per_s
    t, n = 0.0, 0
    with path.open("w") as f:
        while True:
            t += rng.expovariate(peak)
            if t >= duration_s:
                return n
            if diurnal and rng.random() * (1.0 + DIURNAL_SWING) > diurnal_factor(t):
                continue
            interactive = rng.random() < 0.5
            row = {
                "arrival_s": round(t, 4),
                "prompt_tokens": rng.randint(*PROMPT_TOKENS),
                "output_tokens": rng.randint(*OUTPUT_TOKENS),
                "tenant": "acme" if interactive else "bulk",
                "tier": "interactive" if interactive else "batch",
                "workload": "chat" if interactive else "maths",
            }
            f.write(json.dumps(row) + "\n")
            n += 1


@dataclass(frozen=True)
class ReplaySpeed:
    requests: int
    simulated_s: float
    read_s: float
    run_s: float
    """Wall seconds of the replay and its metrics."""
    policy: str
    workers: int = 1
    cpu_s: float = math.nan
    """CPU seconds of the process (reading and replay): the wall time the run would take on an idle core."""
    peak_rss_bytes: int = 0
    """Peak resident memory of the process that replayed (0: not measured)."""

    @property
    def ratio(self) -> float:
        """Simulated seconds per wall second (reading the trace included)."""
        return self.simulated_s / (self.read_s + self.run_s)

    @property
    def worker_s_per_wall_s(self) -> float:
        """Simulated worker-seconds per wall second: the lab's work grows with the fleet, not only the trace."""
        return self.ratio * self.workers

    @property
    def worker_s_per_cpu_s(self) -> float:
        return self.simulated_s * self.workers / self.cpu_s


def measure(
    *,
    duration_s: float = 3600.0,
    rate_per_s: float = 50.0,
    workers: int = 4,
    profile: str = "kimi-k3-dspark-tp16",
    policy: str = "gearshift",
    diurnal: bool = False,
    streamed: bool = True,
) -> ReplaySpeed:
    """Replay a synthetic trace of ``duration_s`` at ``rate_per_s`` on ``workers`` under ``policy``, in a fresh
    process (so that its peak RSS is this replay's alone). ``streamed=False``: every record kept (the
    definitions' path, for comparison)."""
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        job = pool.submit(_measure, duration_s, rate_per_s, workers, profile, policy, diurnal, streamed)
        return job.result()


def _measure(
    duration_s: float, rate_per_s: float, workers: int, profile: str, policy: str, diurnal: bool, streamed: bool
) -> ReplaySpeed:
    prof = load_profile(profile)
    make: LabPolicy = LAB_POLICIES[policy]() if policy in LAB_POLICIES else StaticSchedule.plain(int(policy[2:]))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        n = synthetic_trace(path, duration_s=duration_s, rate_per_s=rate_per_s, diurnal=diurnal)
        cpu_started, started = time.process_time(), time.perf_counter()
        trace = read_trace(path)
        plan = plan_replay(trace, prof, profile_path=profile, workers=workers)
        read_s = time.perf_counter() - started
    started = time.perf_counter()
    run_one(plan, make, prof, streamed=streamed)
    run_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return ReplaySpeed(n, plan.scenario.duration_s, read_s, run_s, make.name, workers, cpu_s, rss)
