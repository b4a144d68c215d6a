"""The gateway's view of the fleet: per worker its config, health, local in-flight count, the state the
controller published and whether it is ejected.

Nothing here is read from the store per request: a background loop re-reads worker states and ejections
every ``state_refresh_s`` and probes each worker's ``/health`` every ``health_interval_s``. Each tick is
wrapped, so a transient store or network error never kills the loop; failures are counted in a metric.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from fleet.clock import Clock
from fleet.config import FleetConfig, WorkerConfig
from fleet.plan import FleetPlan, PoolPlan, read_plans
from fleet.store.protocol import Store, WorkerState
from fleet.worker_mode import WorkerMode, read_modes
from gateway.settings import GatewaySettings
from gateway.usage.metrics import GatewayMetrics

log = logging.getLogger(__name__)


@dataclass(slots=True)
class WorkerView:
    """One worker as the router sees it. The request counts (``in_flight``, ``prefill_tokens``) are changed only
    by the requests' holds on the worker (``gateway.upstream.client.Hold``)."""

    config: WorkerConfig
    id: str = field(init=False)
    """The worker's id (from its config)."""
    healthy: bool = True
    """Last probe (or a refused connection) said so; optimistic until the first probe."""
    probed: bool = False
    probe_timeouts: int = 0
    """Consecutive health probes that timed out."""
    in_flight: int = 0
    """Requests this gateway has open on the worker."""
    prefill_tokens: int = 0
    """Estimated prompt tokens of this gateway's requests on the worker still waiting for their first byte:
    the prefill work outstanding there."""
    state: WorkerState | None = None
    """Published by the controller; None when no controller runs (or its state expired)."""
    ejected_until: float = 0.0
    """Unix seconds; the later of the shared ejection and this gateway's own."""
    ejected_here_until: float = 0.0
    failures: int = 0
    """Consecutive failures seen by this gateway."""
    mode: WorkerMode | None = None
    """Its drafter-free gear record (``fleet.worker_mode``), written by the controller; None: none."""
    pool: PoolPlan | None = None
    """Its pool in its model's fleet plan at the last refresh, while that plan was fresh; None: none."""

    def __post_init__(self) -> None:
        self.id = self.config.id


def load_of(worker: WorkerView) -> float:
    """Requests on the worker: the controller's published running + waiting, or this gateway's own in-flight
    count when it is larger (published state lags by up to a scrape interval)."""
    published = worker.state.running + worker.state.waiting if worker.state else 0.0
    return max(published, float(worker.in_flight))


def occupancy(worker: WorkerView, prefill_tokens_per_slot: int) -> float:
    """The worker's work in requests: ``load_of`` plus this gateway's outstanding prompt tokens there, counted
    ``prefill_tokens_per_slot`` tokens per request (a worker prefilling a 150 k-token prompt admits new requests
    only after it). The queue, speculation and prefix scorers and the overload gate's headroom all read this."""
    return load_of(worker) + worker.prefill_tokens / prefill_tokens_per_slot


@dataclass
class WorkerPool:
    """Every configured worker, its health and shared state, and the ejection policy."""

    fleet: FleetConfig
    store: Store
    clock: Clock
    settings: GatewaySettings
    metrics: GatewayMetrics
    views: dict[str, WorkerView] = field(init=False)
    plans: dict[str, FleetPlan] = field(default_factory=dict)
    """The fleet plans in the store at the last refresh, by model, fresh or not (``fleet.plan``)."""
    on_prefill_done: list[Callable[[str], None]] = field(default_factory=list)
    """Called with the model when a request's prefill on one of its workers ended (``prefill_done``)."""

    def __post_init__(self) -> None:
        self.views = {w.id: WorkerView(config=w) for w in self.fleet.workers}

    def serving(self, model: str) -> list[WorkerView]:
        return [v for v in self.views.values() if v.config.model == model]

    def ready(self) -> bool:
        """At least one probed-healthy, non-ejected worker serves some model."""
        now = self.clock.wall()
        return any(v.probed and v.healthy and v.ejected_until <= now for v in self.views.values())

    # ----------------------------------------------------------------------------------- outcomes
    def prefill_done(self, view: WorkerView) -> None:
        """A request's prefill on ``view`` ended (its first byte, or its end): the worker may have room again."""
        for listener in self.on_prefill_done:
            listener(view.config.model)

    def succeeded(self, view: WorkerView) -> None:
        view.failures = 0
        view.healthy = True

    async def failed(self, view: WorkerView, *, reason: str, refused: bool = False) -> None:
        """Count a failure; a refused connection marks the worker down until a probe succeeds, and
        ``eject_after_failures`` consecutive failures eject it for every replica through the store."""
        view.failures += 1
        if refused:
            view.healthy = False
        if view.failures < self.settings.eject_after_failures:
            return
        view.failures = 0
        until = self.clock.wall() + self.settings.eject_for_s
        view.ejected_until = view.ejected_here_until = until
        self.metrics.ejections.labels(worker=view.id).inc()
        log.warning("ejecting worker %s until %.0f: %s", view.id, until, reason)
        with contextlib.suppress(Exception):
            await self.store.eject(view.id, until=until, reason=reason)

    # ------------------------------------------------------------------------------ background loops
    async def refresh_shared(self) -> None:
        """Re-read published worker states and ejections from the store (one tick). Whether the store answers or
        not, a state older than ``worker_state_max_age_s`` stops counting and the plans' freshness is re-checked,
        so nothing read before an outage stays in force through it."""
        try:
            await self._read_shared()
        finally:
            self._expire_states()
            self._place()

    def _expire_states(self) -> None:
        """Forget states older than their max age; one without a time (``updated_at`` 0: its publisher does not
        stamp it, the controller always does) is left to the store's TTL."""
        oldest = self.clock.wall() - self.settings.worker_state_max_age_s
        for view in self.views.values():
            if view.state is not None and 0 < view.state.updated_at < oldest:
                view.state = None

    async def _read_shared(self) -> None:
        states = await self.store.worker_states()
        ejected = await self.store.ejected(now=self.clock.wall())
        modes = await read_modes(self.store)
        self.plans = await read_plans(self.store)
        for view in self.views.values():
            state = states.get(view.id)
            view.state = state if state is not None and not state.stale else None
            view.mode = modes.get(view.id)
            view.ejected_until = max(ejected.get(view.id, 0.0), view.ejected_here_until)

    def _place(self) -> None:
        """Give each view its pool under its model's plan while that plan is fresh, and export the plans."""
        now = self.clock.wall()
        for model in (m.name for m in self.fleet.models):
            plan = self.plans.get(model)
            if plan is not None:
                self.metrics.plan_version.labels(model=model).set(plan.version)
            self.metrics.plan_fresh.labels(model=model).set(1.0 if plan is not None and plan.fresh(now) else 0.0)
        for view in self.views.values():
            plan = self.plans.get(view.config.model)
            pool = plan.pool_of_worker(view.id) if plan is not None and plan.fresh(now) else None
            if view.pool is not None and (pool is None or pool.name != view.pool.name):
                self.metrics.worker_pool.remove(view.id, view.pool.name)
            if pool is not None:
                self.metrics.worker_pool.labels(worker=view.id, pool=pool.name).set(1.0)
            view.pool = pool

    async def probe_health(self, session: aiohttp.ClientSession) -> None:
        """GET each worker's ``/health`` concurrently (one tick)."""
        timeout = aiohttp.ClientTimeout(total=self.settings.health_timeout_s)

        async def probe(view: WorkerView) -> None:
            try:
                async with session.get(f"{view.config.url}/health", timeout=timeout) as resp:
                    view.healthy = resp.status == 200
                view.probe_timeouts = 0
            except TimeoutError:  # a busy worker (or host) may answer late: only repeated timeouts count
                view.probe_timeouts += 1
                if view.probe_timeouts >= self.settings.health_timeouts_down:
                    view.healthy = False
            except aiohttp.ClientError:
                view.healthy = False
            view.probed = True

        await asyncio.gather(*(probe(v) for v in self.views.values()))
        for view in self.views.values():
            self.metrics.worker_healthy.labels(worker=view.id).set(1.0 if view.healthy else 0.0)

    async def run_loop(self, name: str, tick: Callable[[], Awaitable[None]], interval_s: float) -> None:
        """Run ``tick`` every ``interval_s`` forever; a failing tick is logged, counted and backed off."""
        backoff = interval_s
        while True:
            try:
                await tick()
                backoff = interval_s
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a transient error must never kill the loop
                self.metrics.loop_errors.labels(loop=name).inc()
                log.warning("%s tick failed: %s", name, exc)
                backoff = min(backoff * 2, 30.0)
            await self.clock.sleep(backoff)
