"""Fleet-level work the loop ticks once per pass, after every worker's own tick, behind one interface
(``FleetHook``), in this order:

1. ``GearModeHook`` — the drafter-free gear's restarts (``controller.gear_mode``);
2. ``PlacementHook`` — the fleet plan: pools, their gears and caps (``controller.placement``);
3. ``CostAttribution`` — each worker's cost split over tenants by the ledger (``controller.cost``).

A hook that fails is counted and logged by the loop and runs again next pass; it never stops the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from controller.cost import attribute_to_tenants, prefill_seconds_per_token, profile_tpot_s
from controller.gear_mode import GearModes, GearObservation
from controller.metrics import ControllerMetrics
from controller.placement import FleetPlacement, WorkerSample, worker_gears
from controller.runtime import WorkerRuntime
from fleet.clock import Clock
from fleet.config import TenantsConfig
from fleet.perf import predict_step
from fleet.store.protocol import Store, UsageRecord


class FleetHook(Protocol):
    failure: str
    """What the loop's warning says when a tick of this hook fails."""

    async def tick(self, workers: Sequence[WorkerRuntime]) -> None:
        """One pass over the fleet, after every worker's tick (leader only)."""
        ...


def gear_observation(rt: WorkerRuntime) -> GearObservation:
    """What the drafter-free gear needs of a worker this tick: capacity is k = 0 at ``max_num_seqs`` (with the
    step correction and the observed prefill per output token), load the goodput predicted at its batch."""
    fresh = rt.stale_since_s is None and rt.prev is not None
    est, decision = rt.estimate, rt.decision
    load = capacity = gain = 0.0
    spec_pays = off_pays = False
    if est is not None and decision is not None:
        current = decision.candidate(rt.stab.k) if rt.stab is not None else None
        load = current.goodput_tok_s if current is not None and est.batch > 0 else 0.0
        held = current.goodput_tok_s if current is not None else 0.0
        off = decision.off.goodput_tok_s if decision.off is not None else 0.0
        off_pays = rt.stab is not None and (rt.stab.k == 0 or (off > held and est.batch > 0))
        seqs = float(rt.seqs)
        step = predict_step(
            rt.profile,
            batch=seqs,
            k=0,
            context_per_seq=est.context_per_seq,
            prefill_per_step=est.prefill_per_token * seqs,
        )
        capacity = seqs / (step.total_s * est.step_correction)
        spec_pays = decision.k > 0
        best = decision.candidate(decision.k)
        if rt.drafter_loaded:
            gain = off - held if est.batch > 0 else 0.0  # drafter-free k = 0 over the gear it holds
        else:
            gain = (best.goodput_tok_s if best is not None else 0.0) - held  # the drafter's best gear back
    return GearObservation(
        worker_id=rt.config.id,
        fresh=fresh,
        in_flight=rt.prev.running + rt.prev.waiting if fresh and rt.prev is not None else None,
        off_pays=off_pays,
        spec_pays=spec_pays,
        load_tok_s=load,
        capacity_tok_s=capacity,
        gain_tok_s=gain,
    )


class GearModeHook:
    """The drafter-free gear's moves; with a fleet plan, each worker's pool's drafter mode is the move asked for
    (``controller.drafter_free``, ``WorkerGear.planned_drafter``)."""

    failure = "drafter-free gear tick failed"

    def __init__(self, modes: GearModes, metrics: ControllerMetrics, placement: FleetPlacement | None = None) -> None:
        self.modes = modes
        self.metrics = metrics
        self.placement = placement

    def planned(self, workers: Sequence[WorkerRuntime]) -> dict[str, bool]:
        """Worker → the drafter mode (True: loaded) of its pool in the fresh plan, for the workers a plan covers."""
        if self.placement is None:
            return {}
        found = {rt.config.id: self.placement.planned_drafter(rt.config.id, rt.config.model) for rt in workers}
        return {wid: loaded for wid, loaded in found.items() if loaded is not None}

    async def tick(self, workers: Sequence[WorkerRuntime]) -> None:
        await self.modes.tick([gear_observation(rt) for rt in workers], self.planned(workers))
        self.modes.export(self.metrics)


class PlacementHook:
    """The fleet plan (``controller.placement``): each worker's mode now and whether the drafter-free gear may
    restart it go into the plan, which chooses drafter modes with the pools."""

    failure = "fleet placement tick failed"

    def __init__(
        self, placement: FleetPlacement, k_tiers: Sequence[int] | None, gear_modes: GearModes | None = None
    ) -> None:
        self.placement = placement
        self.k_tiers = None if k_tiers is None else tuple(k_tiers)
        self.gear_modes = gear_modes

    def sample(self, rt: WorkerRuntime) -> WorkerSample:
        return WorkerSample(
            worker_id=rt.config.id,
            model=rt.config.model,
            profile=rt.profile,
            max_num_seqs=rt.seqs,
            gears=worker_gears(self.k_tiers, rt.k_max, rt.full_speed),
            estimate=rt.estimate,
            drafter_loaded=rt.drafter_loaded,
            movable=self.gear_modes is not None and self.gear_modes.may_move(rt.config.id),
            idle_skip=rt.config.drafter.idle_skip,
        )

    async def tick(self, workers: Sequence[WorkerRuntime]) -> None:
        await self.placement.tick([self.sample(rt) for rt in workers])


def fallback_tpot_s(rt: WorkerRuntime) -> float:
    """The TPOT a request on ``rt`` without a measured one is weighed with: the worker's predicted TPOT at the k
    it holds, else its profile's single-stream TPOT (seconds)."""
    chosen = rt.decision.candidate(rt.stab.k) if rt.decision is not None and rt.stab is not None else None
    return chosen.tpot_s if chosen is not None else profile_tpot_s(rt.profile)


class CostAttribution:
    """Every ``interval_s``, split the workers' cost since the last split over tenants by the ledger's records
    (``controller.cost.attribute_to_tenants``, each worker weighed with its own profile) into the per-tenant
    cost metric."""

    failure = "tenant cost attribution failed"

    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        tenants: Callable[[], TenantsConfig],
        metrics: ControllerMetrics,
        interval_s: float,
    ) -> None:
        self.store = store
        self.clock = clock
        self.tenants = tenants
        self.metrics = metrics
        self.interval_s = interval_s
        self.attributed_until = clock.wall()

    async def tick(self, workers: Sequence[WorkerRuntime]) -> None:
        if self.clock.wall() - self.attributed_until >= self.interval_s:
            await self.attribute(workers)

    async def attribute(self, workers: Sequence[WorkerRuntime]) -> dict[str, float]:
        """Attribute now; returns tenant → USD."""
        since, until = self.attributed_until, self.clock.wall()
        records: list[UsageRecord] = []
        for tenant in self.tenants().tenants:
            totals = await self.store.usage(tenant.id, since=since, until=until, limit=100_000)
            records.extend(totals.records)
        shares = attribute_to_tenants(
            records,
            {rt.config.id: rt.usd_since_attribution for rt in workers},
            prefill_s_per_token={rt.config.id: prefill_seconds_per_token(rt.profile) for rt in workers},
            fallback_tpot_s={rt.config.id: fallback_tpot_s(rt) for rt in workers},
        )
        for tenant_id, value in shares.items():
            self.metrics.tenant_cost.labels(self.metrics.tenant_label(tenant_id)).inc(value)
        for rt in workers:
            rt.usd_since_attribution = 0.0
        self.attributed_until = until
        return shares
