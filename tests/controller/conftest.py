"""Shared fixtures of the controller tests: a lab profile with a known break-even batch, estimate builders."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from fleet.perf import Profile, load_profile
from workers.sim.server import SimServer
from workers.sim.settings import SimWorkerSettings

from .ctl_helpers import CONTROL_TOKEN, LAB_PROFILE


@pytest.fixture(scope="session")
def lab_profile() -> Profile:
    return load_profile(LAB_PROFILE)


@pytest.fixture
async def sim_server() -> AsyncIterator[SimServer]:
    """A simulated worker on a free loopback port, 20× faster than real time, on the lab profile."""
    settings = SimWorkerSettings(
        worker_id="rt-0", port=0, profile=str(LAB_PROFILE), speedup=20.0, start_k=8, scheduling="fcfs",
        control_token=CONTROL_TOKEN, seed=3,
    )  # fmt: skip
    server = SimServer(settings)
    await server.start()
    yield server
    await server.stop()
