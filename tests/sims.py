"""Simulated workers on loopback for tests that need real ones (one place for starting and stopping them)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from workers.sim.server import SimServer
from workers.sim.settings import SimWorkerSettings


@contextlib.asynccontextmanager
async def sim_servers(n: int, **settings: Any) -> AsyncIterator[list[SimServer]]:
    """``n`` simulated workers ``w0 … w{n-1}`` on free loopback ports (worker ``i`` seeded ``i``), with
    ``settings`` (``SimWorkerSettings`` fields) over the defaults; each one started is stopped on exit."""
    servers = [SimServer(SimWorkerSettings(worker_id=f"w{i}", port=0, seed=i, **settings)) for i in range(n)]
    async with running(servers):
        yield servers


@contextlib.asynccontextmanager
async def running(servers: Sequence[SimServer]) -> AsyncIterator[None]:
    """Start ``servers`` in order; stop each one started on exit."""
    started: list[SimServer] = []
    try:
        for s in servers:
            await s.start()
            started.append(s)
        yield
    finally:
        for s in started:
            await s.stop()
