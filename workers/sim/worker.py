"""A simulated worker's parts, wired from its settings: speculation control, engine, driver, metrics."""

from __future__ import annotations

from aiohttp import web

from fleet.clock import Clock
from fleet.speculation import SpeculationControl, uniform_schedule
from workers.sim.adaptive import AdaptiveVerification
from workers.sim.driver import RealTimeDriver
from workers.sim.engine import EngineCore
from workers.sim.exposition import SimWorkerMetrics
from workers.sim.settings import SimWorkerSettings
from workers.sim.stats import EngineStats


class SimWorker:
    """Everything one simulated worker runs; the HTTP app reads it, ``start``/``stop`` run its engine loop."""

    def __init__(self, settings: SimWorkerSettings, *, clock: Clock) -> None:
        self.settings = settings
        self.clock = clock
        self.profile = settings.load_profile()
        k_max = settings.effective_k_max()
        start_k = settings.start_k if settings.start_k is not None else k_max
        self.control = SpeculationControl(
            worker_id=settings.worker_id,
            method=settings.method,
            k_max=k_max,
            max_num_seqs=settings.max_num_seqs,
            fallback=uniform_schedule(start_k, max_num_seqs=settings.max_num_seqs),
            clock=clock,
        )
        self.engine = EngineCore(
            self.profile,
            self.control,
            max_num_seqs=settings.max_num_seqs,
            scheduling=settings.scheduling,
            seed=settings.seed,
            kv_capacity_tokens=settings.kv_capacity_tokens,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            adaptive=AdaptiveVerification() if settings.adaptive_verification else None,
        )
        self.driver = RealTimeDriver(self.engine, clock=clock, speedup=settings.speedup)
        self.metrics = SimWorkerMetrics(
            self._scrape_stats,
            self.control,
            model_name=settings.model,
            adaptive_verification=lambda: self.engine.adaptive is not None,
        )
        self.started_at = clock.wall()

    @property
    def default_workload(self) -> str:
        return self.settings.default_workload or self.profile.default_workload

    def _scrape_stats(self) -> EngineStats:
        self.control.expire()  # an idle engine takes no steps; a scrape still shows an expired lease
        return self.engine.stats

    async def start(self) -> None:
        await self.driver.start()

    async def stop(self) -> None:
        await self.driver.stop()


WORKER = web.AppKey("worker", SimWorker)
"""Where the HTTP app keeps its ``SimWorker``."""
