"""The gateway's routing (``gateway.routing.default_router``: filters → weighted scorers → pick) driving the
virtual lab's request placement, so multi-worker scenarios are routed as the gateway would route them.

Each arrival builds the gateway's view of every worker: its configuration, the requests outstanding on it
(the gateway's own in-flight count), and the state the controller last published for it (none for static
policies, where the scorers fall back to least-loaded, exactly as the gateway does with no controller).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping, Sequence

from fleet.clock import Clock
from fleet.config import FleetConfig, TierConfig
from fleet.store import WorkerState
from gateway.pool import WorkerView
from gateway.routing import RouteContext, default_router
from gateway.settings import GatewaySettings
from workers.sim.arrivals import RequestSpec
from workers.sim.virtual import Router, VirtualWorker

StateSource = Callable[[], Mapping[str, WorkerState]]


class GatewayRouter(Router):
    """A lab ``Router`` that ranks workers with the gateway's filters and scorers (weights from settings)."""

    def __init__(
        self,
        *,
        fleet: FleetConfig,
        tiers: Mapping[str, TierConfig],
        clock: Clock,
        states: StateSource,
        seed: int = 0,
        settings: GatewaySettings | None = None,
    ) -> None:
        s = settings or GatewaySettings()
        self._router = default_router(
            weight_queue=s.weight_queue,
            weight_kv=s.weight_kv,
            weight_speculation=s.weight_speculation,
            rng=random.Random(seed),
        )
        self._configs = {w.id: w for w in fleet.workers}
        self._tiers = tiers
        self._default_tier = next(iter(tiers.values()))
        self._clock = clock
        self._states = states
        self._loop = asyncio.new_event_loop()

    def choose(self, workers: Sequence[VirtualWorker], spec: RequestSpec) -> int:
        states = self._states()
        views = [
            WorkerView(config=self._configs[w.worker_id], in_flight=w.outstanding, state=states.get(w.worker_id))
            for w in workers
        ]
        ctx = RouteContext(
            model=workers[0].model_name, tier=self._tiers.get(spec.tag, self._default_tier), now=self._clock.wall()
        )
        decision = self._loop.run_until_complete(self._router.route(ctx, views))
        if not decision.ranked:
            return min(range(len(workers)), key=lambda i: workers[i].outstanding)
        chosen = decision.ranked[0].id
        return next(i for i, w in enumerate(workers) if w.worker_id == chosen)

    def close(self) -> None:
        self._loop.close()
