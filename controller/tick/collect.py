"""Stage 1, collect: scrape a worker, cut the window since the last scrape, update its estimator, and read its
control state (version, lease, full-speed set) when it is unknown or the worker restarted."""

from __future__ import annotations

import logging

from controller.actuator import ActuationError, Actuator
from controller.estimator import Estimate
from controller.metrics import ControllerMetrics
from controller.runtime import WorkerRuntime
from controller.sources import MetricsSource, SourceError
from controller.window import WindowBreak, window_between
from fleet.scrape import COUNTER_FIELDS, WorkerScrape

log = logging.getLogger("gearshift.controller")


def restarted(prev: WorkerScrape, cur: WorkerScrape, version: int | None) -> bool:
    """The worker restarted between two scrapes: a counter went backwards, or its schedule version did."""
    if any(getattr(cur, name) < getattr(prev, name) for name in COUNTER_FIELDS):
        return True
    return cur.spec_version is not None and version is not None and cur.spec_version < version


class Collector:
    """Reads one worker per call: its metrics through ``source``, its control state through ``actuator``."""

    def __init__(self, *, source: MetricsSource, actuator: Actuator, metrics: ControllerMetrics) -> None:
        self.source = source
        self.actuator = actuator
        self.metrics = metrics

    async def collect(self, rt: WorkerRuntime, now: float) -> Estimate:
        """This tick's estimate of the worker (stale when its metrics could not be read). ``now``: monotonic s."""
        scrape = await self._scrape(rt, now)
        if scrape is not None and rt.version is None:
            await self._learn_version(rt)
        stale = scrape is None
        if rt.k_applied is not None and rt.estimator.windows == 0:
            rt.estimator.k_current = rt.k_applied  # before the first window, trust what the worker reports
        stale_for = now - (rt.last_ok_s if rt.last_ok_s is not None else rt.first_seen_s)
        return rt.estimator.estimate(stale=stale, stale_for_s=stale_for if stale else 0.0)

    async def _scrape(self, rt: WorkerRuntime, now: float) -> WorkerScrape | None:
        wid = rt.config.id
        try:
            scrape = await self.source.scrape(rt.config)
        except SourceError as exc:
            self.metrics.scrape_failures.labels(wid).inc()
            self.metrics.stale.labels(wid).set(1)
            was_fresh = rt.stale_since_s is None
            log.log(logging.WARNING if was_fresh else logging.DEBUG, "%s (worker marked stale)", exc)
            rt.stale_since_s = rt.stale_since_s if rt.stale_since_s is not None else now
            rt.window = None
            return None
        if rt.stale_since_s is not None:
            log.info("worker %s: metrics readable again after %.0f s", wid, now - rt.stale_since_s)
            rt.stale_since_s = None
        self.metrics.stale.labels(wid).set(0)
        rt.window = None
        rt.estimator.adaptive = scrape.adaptive_verification is True
        rt.estimator.max_num_seqs = rt.seqs
        rt.elapsed_s = scrape.at_s - rt.prev.at_s if rt.prev is not None else 0.0
        if rt.prev is not None and not rt.rebase:
            try:
                rt.window = window_between(rt.prev, scrape, k=rt.k_applied or 0)
                rt.estimator.update(rt.window)
            except WindowBreak as exc:
                log.debug("worker %s: window skipped: %s", wid, exc)
        was_restarted = rt.prev is not None and restarted(rt.prev, scrape, rt.version)
        rt.prev, rt.rebase, rt.last_ok_s = scrape, False, now
        if scrape.spec_k is not None:
            rt.k_applied = scrape.spec_k
            rt.schedule_applied = scrape.spec_schedule
        if was_restarted:
            log.info("worker %s restarted: reading its version and full-speed set again", wid)
            rt.version = None  # _learn_version reads the worker's state (full_speed included) this tick
        return scrape

    async def _learn_version(self, rt: WorkerRuntime) -> None:
        try:
            state = await self.actuator.current(rt.config)
        except ActuationError as exc:
            self.metrics.actuation_failures.labels(rt.config.id).inc()
            log.warning("%s", exc)
            return
        rt.learn(state)
        full_speed = None if state.full_speed is None else tuple((k, lo, hi) for k, lo, hi in state.full_speed)
        if full_speed != rt.full_speed:
            log.info("worker %s: full-speed set %s", rt.config.id, full_speed if full_speed is not None else "all")
        rt.full_speed = full_speed
        rt.max_num_seqs = state.fallback_schedule[-1][1] if state.fallback_schedule else None
