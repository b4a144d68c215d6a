"""Profile one worker end to end: sweep it, fit the profile, render the YAML."""

from __future__ import annotations

import httpx

from bench.profiler.fit import Fit, fitted_profile
from bench.profiler.sweep import Progress, SweepConfig, sweep
from bench.profiler.worker_client import WorkerClient
from fleet.perf import Profile


async def profile_worker(
    url: str,
    config: SweepConfig,
    *,
    base: Profile,
    control_token: str,
    name: str | None = None,
    workload: str = "measured",
    progress: Progress | None = None,
) -> Fit:
    """Sweep the worker at ``url`` and fit ``base``'s step-time parameters and acceptance to it."""
    limits = httpx.Limits(max_connections=max(config.batch_sizes) + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0), limits=limits) as client:
        worker = WorkerClient(client, url, control_token=control_token)
        state = await worker.speculation()
        points = await sweep(worker, config, progress=progress)
    return fitted_profile(
        base,
        points,
        name=name or f"profiled-{state.worker_id}",
        k_max=state.k_max,
        workload=workload,
        description=f"Fitted by gearshift profile to worker {state.worker_id} ({state.method}) at {url}",
    )
