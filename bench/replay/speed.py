"""How fast the lab replays a trace (a benchmark, not a test): a synthetic Poisson trace written to a file, read
back, and replayed under one policy; the figure of merit is simulated seconds per wall second, with the time to
read the trace and to compute the metrics counted in the wall time.

The reference (issue 17): a 1-hour trace at 50 req/s on 4 workers. The request shape is the calibration's
general chat mix, short enough (prompt 512, output 64 tokens) that 4 workers of the default profile are loaded
but not swamped.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.policy.policies import LAB_POLICIES, LabPolicy, StaticSchedule
from bench.replay.run import run_one
from bench.replay.scenario import plan_replay
from bench.replay.trace import read_trace
from fleet.perf import load_profile

PROMPT_TOKENS = (256, 768)
OUTPUT_TOKENS = (32, 96)


def synthetic_trace(path: Path, *, duration_s: float, rate_per_s: float, seed: int = 7) -> int:
    """Write a plain JSONL trace of Poisson arrivals (half interactive chat, half batch maths); return its size."""
    rng = random.Random(seed)
    t, n = 0.0, 0
    with path.open("w") as f:
        while True:
            t += rng.expovariate(rate_per_s)
            if t >= duration_s:
                return n
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

    @property
    def ratio(self) -> float:
        """Simulated seconds per wall second (reading the trace included)."""
        return self.simulated_s / (self.read_s + self.run_s)


def measure(
    *,
    duration_s: float = 3600.0,
    rate_per_s: float = 50.0,
    workers: int = 4,
    profile: str = "kimi-k3-dspark-tp16",
    policy: str = "gearshift",
) -> ReplaySpeed:
    """Replay a synthetic trace of ``duration_s`` at ``rate_per_s`` on ``workers`` under ``policy``."""
    prof = load_profile(profile)
    make: LabPolicy = LAB_POLICIES[policy]() if policy in LAB_POLICIES else StaticSchedule.plain(int(policy[2:]))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        n = synthetic_trace(path, duration_s=duration_s, rate_per_s=rate_per_s)
        started = time.perf_counter()
        trace = read_trace(path)
        plan = plan_replay(trace, prof, profile_path=profile, workers=workers)
        read_s = time.perf_counter() - started
    started = time.perf_counter()
    run_one(plan, make, prof)
    return ReplaySpeed(n, plan.scenario.duration_s, read_s, time.perf_counter() - started, make.name)
