"""Fixtures of the profiler tests: an in-process simulated worker whose clock only runs while it sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from workers.sim.server import SimServer
from workers.sim.settings import SimWorkerSettings

CONTROL_TOKEN = "profiler-test-token"
SPEEDUP = 20.0


class PacedClock:
    """A clock that advances only by what its sleepers sleep (real ``asyncio.sleep`` underneath).

    The simulated engine starts each step at max(its own end of the last step, the clock), so with the
    system clock any CPU time the test process spends elsewhere (the profiler's scrapes, the streams) is
    added to the simulated step times, by up to 2× at a high speedup on two cores. Under this clock that
    time does not count, so the worker's ``/metrics`` show exactly the profile's step times.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._start = start
        self._elapsed = 0.0

    def wall(self) -> float:
        return self._start + self._elapsed

    def monotonic(self) -> float:
        return self._elapsed

    async def sleep(self, seconds: float) -> None:
        begin = self._elapsed
        await asyncio.sleep(seconds)
        self._elapsed = max(self._elapsed, begin + seconds)


@pytest.fixture
async def sim_worker() -> AsyncIterator[SimServer]:
    """The Kimi K3 + DSpark simulated worker (profile kimi-k3-dspark-tp16) on a free loopback port."""
    settings = SimWorkerSettings(port=0, speedup=SPEEDUP, seed=7, max_num_seqs=64, control_token=CONTROL_TOKEN)
    server = SimServer(settings, clock=PacedClock())
    await server.start()
    yield server
    await server.stop()
