"""Several simulated workers in one event loop: the simulated part of a fleet file (``gearshift up``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from fleet.clock import Clock, SystemClock
from fleet.config import FleetConfig, ModelConfig, WorkerConfig, WorkerKind
from workers.sim.server import SimServer
from workers.sim.settings import SimWorkerSettings


def worker_settings(worker: WorkerConfig, model: ModelConfig, **overrides: Any) -> SimWorkerSettings:
    """Settings of the simulated worker a fleet file describes (its URL gives host and port)."""
    url = urlsplit(worker.url)
    if url.hostname is None or url.port is None:
        raise ValueError(f"workers[{worker.id}].url: {worker.url!r} needs an explicit host and port")
    values: dict[str, Any] = {
        "worker_id": worker.id,
        "host": url.hostname,
        "port": url.port,
        "model": model.name,
        "profile": model.profile,
        "context_window": model.context_window,
        "max_num_seqs": worker.max_num_seqs,
        "method": worker.drafter.method,
        "k_max": worker.drafter.k_max,
        **overrides,
    }
    return SimWorkerSettings(**values)


def fleet_worker_settings(fleet: FleetConfig, *, seed: int = 0, **overrides: Any) -> list[SimWorkerSettings]:
    """Settings for every ``kind: sim`` worker of ``fleet``; worker i gets seed ``seed + i``."""
    out = []
    sims = [w for w in fleet.workers if w.kind == WorkerKind.SIM]
    for i, worker in enumerate(sims):
        model = fleet.model(worker.model)
        assert model is not None  # FleetConfig validates worker models
        out.append(worker_settings(worker, model, seed=seed + i, **overrides))
    return out


class SimFleet:
    """Runs simulated workers side by side; started and stopped together (a ``gearshift up`` component)."""

    name = "simulated workers"

    def __init__(self, settings: Sequence[SimWorkerSettings], *, clock: Clock | None = None) -> None:
        clock = clock or SystemClock()
        self.servers = [SimServer(s, clock=clock) for s in settings]

    async def start(self) -> None:
        started: list[SimServer] = []
        try:
            for server in self.servers:
                await server.start()
                started.append(server)
        except BaseException:
            for server in reversed(started):
                await server.stop()
            raise

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers if s.port is not None))

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def describe(self) -> list[str]:
        return [
            f"worker {s.settings.worker_id}: {s.url}  (model {s.settings.model}, "
            f"profile {s.settings.profile}, speedup {s.settings.speedup:g}×)"
            for s in self.servers
        ]
