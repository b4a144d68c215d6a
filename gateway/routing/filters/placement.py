"""Placement routing (DESIGN §9): send each request to its traffic class's pool in the controller's fleet plan.

A request's class is ``"<tier>/<workload>"`` (``fleet.plan.traffic_class``). Its workload comes from the
``x-gearshift-workload`` request header, else its tenant's ``workload`` in the tenants file, else
``"default"``. The header is read by the gateway only: the worker never sees it (the gateway sends its own
headers upstream).

``PlacementFilter`` keeps, for a request of class ``c`` under a fresh plan (``FleetPlan.fresh``):

1. **home**: the workers of the pools that serve ``c`` and the workers the plan leaves out of every pool, that
   have *room*;
2. else **spill**: workers of other pools that have room and that ``c`` may use. Spill-over is one way: a
   request may always use a worker whose pool protects no TPOT target, or one no tighter than its own tier's
   target (interactive work may use any worker); otherwise (batch work on an interactive worker) only while
   that worker's predicted TPOT with one more sequence (``predicted_tpot_s``) stays within
   ``(1 − spill_margin) ×`` the pool's target, and while its load is below the plan's ``spill_limit/<pool>``
   (``FleetPlan.spill_limit``: the planner's bound for the same margin on the forecast mix), when it has one;
3. else the home workers without room (the overload gate then holds the request until one has a slot, since a
   worker's free slots count its cap), or, with no home worker left at all, the spill candidates without room.

A worker has *room* while its load (``gateway.routing.pool.load_of``: the published running + waiting, or this
gateway's in-flight count when larger) is below its pool's ``max_concurrency``; a pool without a cap always has
room. A pool's protected target is the tightest ``tpot_target_s`` of the tiers its classes name (None: a batch
pool). With no plan for the model, a stale plan, or a class no pool serves, every worker is kept: routing is
on load alone, as without placement.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Final

from fleet.config import FleetConfig, TenantConfig, TenantsConfig, TierConfig
from fleet.perf import Profile, predict_step, worker_profiles
from fleet.plan import FleetPlan, PoolPlan
from gateway.errors import InvalidRequest
from gateway.routing.context import RouteContext
from gateway.routing.pool import WorkerView, load_of
from gateway.usage.metrics import GatewayMetrics

WORKLOAD_HEADER: Final = b"x-gearshift-workload"
"""Request header naming the request's workload (``chat``, ``maths``, ``code`` …)."""
_WORKLOAD = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def request_workload(header: str | None, tenant: TenantConfig) -> str | None:
    """The request's workload: its ``x-gearshift-workload`` header, else the tenant's default (None: neither).
    A header that is not 1–64 letters, digits, ``_``, ``.`` or ``-`` is refused (400)."""
    if header is None:
        return tenant.workload
    if not _WORKLOAD.match(header):
        message = f"'x-gearshift-workload' must be 1-64 letters, digits, '_', '.' or '-'; got {header[:80]!r}."
        raise InvalidRequest(message, param="x-gearshift-workload")
    return header


class Placement(StrEnum):
    """Where ``PlacementFilter`` sent a request (the ``outcome`` label of the gateway's placement counter)."""

    UNPLANNED = "unplanned"
    """No fresh plan for the model, or no pool serves the class: load-only."""
    HOME = "home"
    SPILL = "spill"
    SATURATED = "saturated"
    """Every candidate is at its cap: the home workers are kept and the overload gate waits for a slot."""


def predicted_tpot_s(worker: WorkerView, profile: Profile) -> float | None:
    """TPOT on ``worker`` once one more sequence decodes there, seconds; None without published state.

    ``B = max(running, in_flight)`` sequences decode at the applied k with ``ctx = kv_usage ·
    kv_capacity_tokens / B`` context tokens each; the step time grows by ``predict_step(B + 1) / predict_step(B)``
    (``fleet.perf``). That ratio scales the controller's published TPOT when there is one (it carries the
    controller's online correction), else the profiled step over the published accepted length."""
    state = worker.state
    if state is None or state.k_applied < 0:
        return None
    batch = max(state.running, float(worker.in_flight), 1.0)
    context = state.kv_usage * profile.hardware.kv_capacity_tokens / batch
    now = predict_step(profile, batch=batch, k=state.k_applied, context_per_seq=context, drafter_loaded=True)
    more = predict_step(profile, batch=batch + 1, k=state.k_applied, context_per_seq=context, drafter_loaded=True)
    if state.tpot_predicted_s:
        return state.tpot_predicted_s * more.total_s / now.total_s
    return more.total_s / max(state.accepted_length, 1.0)


def has_room(worker: WorkerView, pool: PoolPlan | None) -> bool:
    """``worker`` is below its pool's ``max_concurrency`` (always, without a pool or a cap)."""
    cap = pool.max_concurrency if pool is not None else None
    return cap is None or load_of(worker) < cap


class PlacementFilter:
    """Keep the workers of the request's pool, or those it may spill to (the module docstring's rules); each
    outcome is counted in ``metrics`` when given."""

    name = "placement"

    def __init__(
        self,
        *,
        tiers: Mapping[str, TierConfig],
        profiles: Mapping[str, Profile],
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self._tiers = dict(tiers)
        self._profiles = dict(profiles)
        self._metrics = metrics

    def _count(self, ctx: RouteContext, outcome: Placement) -> None:
        if self._metrics is not None:
            self._metrics.child(self._metrics.placement_routes, ctx.model, outcome.value).inc()

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[WorkerView]:
        plan, cls = ctx.plan, ctx.traffic_class
        if plan is None or cls is None or plan.model != ctx.model or not plan.fresh(ctx.now):
            self._count(ctx, Placement.UNPLANNED)
            return list(workers)
        homes = plan.pools_for(cls)
        if not homes:
            self._count(ctx, Placement.UNPLANNED)
            return list(workers)
        pool_of = {w: p for p in plan.pools for w in p.workers}
        home_pools = {h.name for h in homes}
        home = [w for w in workers if (pool := pool_of.get(w.id)) is None or pool.name in home_pools]
        open_home = [w for w in home if has_room(w, pool_of.get(w.id))]
        if open_home:
            self._count(ctx, Placement.HOME)
            return open_home
        home_ids = {w.id for w in home}
        spill = [w for w in workers if w.id not in home_ids and self._may_spill(ctx, plan, w, pool_of[w.id])]
        open_spill = [w for w in spill if has_room(w, pool_of[w.id])]
        if open_spill:
            self._count(ctx, Placement.SPILL)
            return open_spill
        self._count(ctx, Placement.SATURATED)
        return home or spill

    def _may_spill(self, ctx: RouteContext, plan: FleetPlan, worker: WorkerView, pool: PoolPlan) -> bool:
        target = pool.tpot_target(self._tiers)
        own = ctx.tier.tpot_target_s
        if target is None or (own is not None and own <= target):
            return True
        limit = plan.spill_limit(pool.name)
        if limit is not None and load_of(worker) >= limit:
            return False
        profile = self._profiles.get(worker.id)
        tpot = predicted_tpot_s(worker, profile) if profile is not None else None
        return tpot is not None and tpot <= (1.0 - plan.spill_margin) * target


def placement_filter(
    fleet: FleetConfig, tenants: TenantsConfig, *, metrics: GatewayMetrics | None = None
) -> PlacementFilter:
    """The filter for this fleet: each worker's profile from its model, the tiers from the tenants file."""
    return PlacementFilter(tiers=tenants.tiers, profiles=worker_profiles(fleet), metrics=metrics)
