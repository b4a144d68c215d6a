"""The gateway's routing (``gateway.routing.default_router``: filters → weighted scorers → pick) driving the
virtual lab's request placement, so multi-worker scenarios are routed as the gateway would route them.

Each arrival builds the gateway's view of every worker: its configuration, the requests outstanding on it
(the gateway's own in-flight count), the prompt tokens of those not yet past their first token (the
gateway's outstanding prefill estimate), and the state the controller last published for it (none for static
policies, where the scorers fall back to least-loaded, exactly as the gateway does with no controller).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping, Sequence

from fleet.clock import Clock
from fleet.config import FleetConfig, TierConfig
from fleet.store.protocol import WorkerState
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
            prefill_tokens_per_slot=s.prefill_tokens_per_slot,
            rng=random.Random(seed),
        )
        self._configs = {w.id: w for w in fleet.workers}
        self._tiers = tiers
        self._default_tier = next(iter(tiers.values()))
        self._clock = clock
        self._states = states
        self._loop = asyncio.new_event_loop()
        self._routed_prompt_tokens: dict[str, int] = {}
        """Prompt tokens of every request this router sent to each worker (tokens)."""

    def _prefill_tokens(self, worker: VirtualWorker) -> int:
        """Prompt tokens routed to ``worker`` whose first token has not come out yet: everything routed there
        less the engine's prompt-token counter (which counts a prompt at its first token)."""
        routed = self._routed_prompt_tokens.get(worker.worker_id, 0)
        return max(0, routed - worker.engine.stats.prompt_tokens)

    def choose(self, workers: Sequence[VirtualWorker], spec: RequestSpec) -> int:
        states = self._states()
        views = [
            WorkerView(
                config=self._configs[w.worker_id],
                in_flight=w.outstanding,
                prefill_tokens=self._prefill_tokens(w),
                state=states.get(w.worker_id),
            )
            for w in workers
        ]
        ctx = RouteContext(
            model=workers[0].model_name, tier=self._tiers.get(spec.tag, self._default_tier), now=self._clock.wall()
        )
        decision = self._loop.run_until_complete(self._router.route(ctx, views))
        if decision.ranked:
            chosen = decision.ranked[0].id
            index = next(i for i, w in enumerate(workers) if w.worker_id == chosen)
        else:
            index = min(range(len(workers)), key=lambda i: workers[i].outstanding)
        worker_id = workers[index].worker_id
        self._routed_prompt_tokens[worker_id] = self._routed_prompt_tokens.get(worker_id, 0) + spec.prompt_tokens
        return index

    def close(self) -> None:
        self._loop.close()
