"""A simulated worker's parts, wired from its settings: speculation control, engine, driver, metrics.

``restart(drafter=…)`` restarts the worker with or without its drafter (the drafter-free gear, issue 14): it
serves nothing for the profile's ``serving.restart_s`` (in simulated seconds), then comes back with fresh
counters and a fresh speculation control, as a restarted vLLM would.
"""

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
        self.restarting = False
        self.restarts = 0
        self._build(drafter=True)
        self.started_at = clock.wall()

    def _build(self, *, drafter: bool) -> None:
        """The parts of a worker started with its drafter or without it (k_max 0: k = 0 is all it runs)."""
        settings, clock = self.settings, self.clock
        k_max = settings.effective_k_max() if drafter else 0
        start_k = (settings.start_k if settings.start_k is not None else k_max) if drafter else 0
        self.control = SpeculationControl(
            worker_id=settings.worker_id,
            method=settings.method,
            k_max=k_max,
            max_num_seqs=settings.max_num_seqs,
            fallback=uniform_schedule(start_k, max_num_seqs=settings.max_num_seqs),
            clock=clock,
            full_speed=None if drafter else ((0, 1, settings.max_num_seqs),),
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
            drafter_loaded=drafter,
            idle_drafter=settings.idle_drafter,
            prefix_caching=settings.enable_prefix_caching,
        )
        self.driver = RealTimeDriver(self.engine, clock=clock, speedup=settings.speedup)
        self.metrics = SimWorkerMetrics(
            self._scrape_stats,
            self.control,
            model_name=settings.model,
            adaptive_verification=lambda: self.engine.adaptive is not None,
        )

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

    @property
    def drafter_loaded(self) -> bool:
        return self.engine.drafter_loaded

    @property
    def restart_s(self) -> float:
        """One restart, real seconds: the profile's ``restart_s`` (simulated seconds; 0 when not modelled) over
        the clock's ``speedup``."""
        return (self.profile.serving.restart_s or 0.0) / self.settings.speedup

    async def restart(self, *, drafter: bool) -> None:
        """Stop, wait ``restart_s``, and serve again with or without the drafter. Requests still in the engine
        fail, as in a real restart: drain the worker first (``controller.gear_mode`` does)."""
        self.restarting = True
        try:
            await self.driver.stop()
            self.driver.abort_all()  # what a drain left behind fails now rather than hangs
            await self.clock.sleep(self.restart_s)
            self._build(drafter=drafter)
            await self.driver.start()
            self.restarts += 1
        finally:
            self.restarting = False


WORKER = web.AppKey("worker", SimWorker)
"""Where the HTTP app keeps its ``SimWorker``."""
