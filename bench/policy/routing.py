"""The gateway's routing (``gateway.routing.router.default_router``: filters → weighted scorers → pick) driving the
virtual lab's request placement, so multi-worker scenarios are routed as the gateway would route them.

Each arrival builds the gateway's view of every worker: its configuration, the requests outstanding on it
(the gateway's own in-flight count), the prompt tokens of those not yet past their first token (the
gateway's outstanding prefill estimate), and the state the controller last published for it (none for static
policies, where the scorers fall back to least-loaded, exactly as the gateway does with no controller).

With a placement (``Placement``, from a policy that places traffic: ``bench.policy.fleet_placement``) the
router follows it. A plan's routing (``shares`` None) is the gateway's own: its ``gateway.routing.placement``
filter (the class's pool, else one-way spill bounded by SLA headroom, a stale plan ignored) runs first among
the filters, on a ``RouteContext`` carrying the request's class and the plan, exactly as in the gateway. A
static placement (``shares`` set) narrows the workers to one of the class's pools first, drawn by the fixed
shares (seeded), and never spills.

A request's speculation mode is resolved as the gateway resolves it (``request_speculation``: the lab's requests
send no header, so it is their tier's ``speculation``), and the gateway's own ``SpeculationFilter`` applies it:
an ``off`` request goes only to a worker started without its drafter (its mode record says ``drafter-free``) or
to a free-k = 0 worker of a fresh plan pool pinned at k = 0. Where no worker may serve it the gateway answers
503; the lab must place every arrival, so it goes to the least-loaded worker and is recorded in
``GatewayRouter.refused``, and its SLA verdict is a miss (``bench.policy.run_metrics.verdicts``): a promise the
fleet could not keep is never passed off as kept.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from bench.policy.drive import drive
from fleet.clock import Clock
from fleet.config import FleetConfig, SpeculationMode, TenantConfig, TenantsConfig, TierConfig
from fleet.perf import Profile
from fleet.plan import FleetPlan, TrafficClass, traffic_class
from fleet.store.protocol import WorkerState
from fleet.worker_mode import WorkerMode
from gateway.routing.context import RouteContext
from gateway.routing.filters.placement import PlacementFilter, placement_filter
from gateway.routing.filters.speculation import request_speculation
from gateway.routing.pool import WorkerView
from gateway.routing.router import default_router
from gateway.settings import GatewaySettings
from workers.sim.arrivals import RequestSpec
from workers.sim.virtual import Router, VirtualWorker

StateSource = Callable[[], Mapping[str, WorkerState]]


@dataclass(frozen=True)
class Placement:
    """What a placing policy routes by: a plan, and for a static placement each class's share per pool."""

    plan: FleetPlan
    shares: Mapping[TrafficClass, Mapping[str, float]] | None = None
    """Class → pool name → share of the class's requests (summing to 1); None: the plan's routing with spill."""


PlacementSource = Callable[[], Placement | None]


ModeSource = Callable[[], Mapping[str, WorkerMode]]


@runtime_checkable
class ModalPolicy(Protocol):
    """A lab policy that moves workers to and from the drafter-free gear: the lab routes by its records."""

    def worker_modes(self) -> Mapping[str, WorkerMode]: ...


@runtime_checkable
class PlacingPolicy(Protocol):
    """A lab policy that places traffic: the lab routes by its ``placement()`` (None: load only)."""

    def placement(self) -> Placement | None: ...


def static_pool(placement: Placement, cls: TrafficClass, workers: Sequence[VirtualWorker], draw: float) -> list[int]:
    """Indices of the workers of the pool a static placement's ``draw`` (in [0, 1)) picks for ``cls`` (every
    worker when the class has no shares or the pool is empty)."""
    shares = placement.shares or {}
    acc = 0.0
    for pool_name, share in shares.get(cls, {}).items():
        acc += share
        if draw < acc:
            pool = next(p for p in placement.plan.pools if p.name == pool_name)
            return [i for i, w in enumerate(workers) if w.worker_id in pool.workers] or list(range(len(workers)))
    return list(range(len(workers)))


class GatewayRouter(Router):
    """A lab ``Router`` that ranks workers with the gateway's filters and scorers (weights from settings)."""

    @staticmethod
    def _placement_filter(
        fleet: FleetConfig, tiers: Mapping[str, TierConfig], profile: Profile | None
    ) -> PlacementFilter:
        """The gateway's placement filter; with ``profile``, every worker runs it (a lab profile need not be a
        built-in one the fleet's model could name)."""
        if profile is None:
            return placement_filter(fleet, TenantsConfig(tiers=dict(tiers), tenants=()))
        return PlacementFilter(tiers=tiers, profiles={w.id: profile for w in fleet.workers})

    def __init__(
        self,
        *,
        fleet: FleetConfig,
        tiers: Mapping[str, TierConfig],
        clock: Clock,
        states: StateSource,
        seed: int = 0,
        settings: GatewaySettings | None = None,
        placement: PlacementSource | None = None,
        modes: ModeSource | None = None,
        profile: Profile | None = None,
    ) -> None:
        """``modes``: the workers' drafter-free gear records (``fleet.worker_mode``; None: none), for the
        gateway's draining filter; a worker restarting in the lab (``VirtualWorker.offline_until_s``) is unhealthy."""
        s = settings or GatewaySettings()
        self._placement = placement
        self._modes = modes
        self._draws = random.Random(seed + 7919)
        self._router = default_router(
            s.model_copy(update={"weight_ttft": 0.0}),  # the lab's router has always left the TTFT scorer out
            fleet,
            placement=self._placement_filter(fleet, tiers, profile) if placement else None,
            rng=random.Random(seed),
        )
        self._views = {w.id: WorkerView(config=w) for w in fleet.workers}
        """One view per worker, kept across requests as the gateway's pool keeps them; ``_rank`` sets the fields
        the lab knows before each request (nothing the router runs changes a view)."""
        self._tiers = tiers
        self._default_tier = next(iter(tiers.values()))
        self._clock = clock
        self._states = states
        self._loop = asyncio.new_event_loop()
        self._routed_prompt_tokens: dict[str, int] = {}
        """Prompt tokens of every request this router sent to each worker (tokens)."""
        self._tenants = {name: TenantConfig(id=name, tier=name) for name in tiers}
        """The lab's tenant of each tier (``bench.policy.controller_policy.tenants_for``): it sends no header."""
        self.refused: list[tuple[int, str, str]] = []
        """``(arrival ordinal, worker id, tier)`` of every request whose speculation mode left no worker (the
        gateway's 503), placed least-loaded; the ordinal counts this router's calls from 0, one per arrival, so it
        is the request's index in the lab's ``records.requests`` (kept whole unless streamed)."""
        self._arrivals = 0

    def _prefill_tokens(self, worker: VirtualWorker) -> int:
        """Prompt tokens routed to ``worker`` whose first token has not come out yet: everything routed there
        less the engine's prompt-token counter (which counts a prompt at its first token)."""
        routed = self._routed_prompt_tokens.get(worker.worker_id, 0)
        return max(0, routed - worker.engine.prompt_tokens)

    def choose(self, workers: Sequence[VirtualWorker], spec: RequestSpec) -> int:
        tier = self._tiers.get(spec.tag, self._default_tier)
        tenant = self._tenants.get(spec.tag) or TenantConfig(id=spec.tag or "default", tier=spec.tag or "default")
        mode = request_speculation(None, tenant, tier)
        placement = self._placement() if self._placement is not None else None
        cls = traffic_class(spec.tag, spec.workload)
        if placement is not None and placement.shares is not None:
            subset = static_pool(placement, cls, workers, self._draws.random())
            return subset[self._rank([workers[i] for i in subset], spec, tier, mode=mode)]
        return self._rank(workers, spec, tier, cls, placement.plan if placement is not None else None, mode=mode)

    def _rank(
        self,
        workers: Sequence[VirtualWorker],
        spec: RequestSpec,
        tier: TierConfig,
        cls: TrafficClass | None = None,
        plan: FleetPlan | None = None,
        *,
        mode: SpeculationMode = SpeculationMode.AUTO,
    ) -> int:
        """The index in ``workers`` of the worker the gateway's router picks (least outstanding without a pick),
        routing as ``cls`` under ``plan`` (None: no class, no plan) in speculation ``mode``."""
        states = self._states()
        modes = self._modes() if self._modes is not None else {}
        now_s = self._clock.monotonic()
        views = [self._views[w.worker_id] for w in workers]
        for w, view in zip(workers, views, strict=True):
            view.in_flight = w.outstanding
            view.prefill_tokens = self._prefill_tokens(w)
            view.state = states.get(w.worker_id)
            view.healthy = w.offline_until_s <= now_s
            view.mode = modes.get(w.worker_id)
        ctx = RouteContext(
            model=workers[0].model_name, tier=tier, now=self._clock.wall(), traffic_class=cls, plan=plan,
            speculation=mode,
        )  # fmt: skip
        decision = drive(self._router.route(ctx, views), self._loop)
        if decision.ranked:
            chosen = decision.ranked[0].id
            index = next(i for i, w in enumerate(workers) if w.worker_id == chosen)
        else:
            index = min(range(len(workers)), key=lambda i: workers[i].outstanding)
        worker_id = workers[index].worker_id
        if not decision.ranked and mode is SpeculationMode.OFF:
            self.refused.append((self._arrivals, worker_id, spec.tag))
        self._arrivals += 1
        self._routed_prompt_tokens[worker_id] = self._routed_prompt_tokens.get(worker_id, 0) + spec.prompt_tokens
        return index

    def close(self) -> None:
        self._loop.close()
