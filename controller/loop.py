"""The control loop (DESIGN §5). Every tick, as leader, for every worker concurrently (``controller.tick``):

    collect → decide → govern → push → report

then the fleet hooks (``controller.fleet_hooks``): drafter-free gear modes → fleet placement → tenant cost
attribution. One leader at a time through the store's lease (HA); standbys wait.

The loop never dies of a transient error (STYLE 10): each worker's tick and each hook is isolated, a failure is
counted and retried next tick (the whole pass after an exponential back-off), and a failing worker is only
marked stale.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from controller.actuator import Actuator
from controller.canary import CanaryGate
from controller.estimator import WorkerEstimator
from controller.fleet_hooks import CostAttribution, FleetHook, GearModeHook, PlacementHook
from controller.gear_mode import GearModes
from controller.metrics import ControllerMetrics
from controller.placement import FleetPlacement
from controller.runtime import WorkerRuntime, tpot_target, ttft_target
from controller.settings import ControllerSettings
from controller.sources import MetricsSource
from controller.stabiliser import initial_state
from controller.tick.collect import Collector
from controller.tick.decide import decide_worker
from controller.tick.govern import Canary, DrafterFreeHold, Guard, ObeyPool, Proposal, Stabilise, govern
from controller.tick.push import Pusher
from controller.tick.report import account, record_action, worker_state
from fleet.clock import Clock
from fleet.config import FleetConfig, TenantsConfig
from fleet.perf import Profile, load_profile
from fleet.store.protocol import Store, WorkerState
from fleet.tenants import read_merged
from fleet.worker_mode import Phase

__all__ = ["Controller", "WorkerRuntime", "tpot_target", "ttft_target"]

log = logging.getLogger("gearshift.controller")


class Controller:
    """Controls every worker of a fleet. ``tick`` is one pass (as leader); ``run`` adds leadership and pacing."""

    def __init__(
        self,
        *,
        fleet: FleetConfig,
        tenants: TenantsConfig,
        settings: ControllerSettings,
        source: MetricsSource,
        actuator: Actuator,
        store: Store,
        clock: Clock,
        metrics: ControllerMetrics | None = None,
        holder_id: str = "controller",
        profiles: Mapping[str, Profile] | None = None,
        gear_modes: GearModes | None = None,
    ) -> None:
        """``profiles``: profile name → profile, for profiles not to be loaded by name (the lab's). ``gear_modes``:
        the drafter-free gear's moves (None: every worker keeps the mode it was started in)."""
        self.settings, self.store, self.clock, self.holder_id = settings, store, clock, holder_id
        self.metrics = metrics or ControllerMetrics(tenant_label=settings.tenant_labeler())
        self.is_leader = False
        self.tenants_file = self.tenants = tenants
        """``tenants``: the file merged with the store's run-time changes, re-read every tick."""
        self.workers = self._runtimes(fleet, profiles or {})
        self.collector = Collector(source=source, actuator=actuator, metrics=self.metrics)
        self.pusher = Pusher(actuator=actuator, lease_s=settings.schedule_lease_s, metrics=self.metrics)
        self.gear_modes = gear_modes
        self.canary = (
            CanaryGate(settings.canary_worker, settings.canary_ticks) if settings.canary_worker is not None else None
        )
        self.placement = (
            FleetPlacement(settings.placement, store=store, clock=clock, tenants=tenants, metrics=self.metrics)
            if settings.placement.enabled
            else None
        )
        self.attribution = CostAttribution(
            store=store, clock=clock, tenants=lambda: self.tenants, metrics=self.metrics,
            interval_s=settings.tenant_interval_s,
        )  # fmt: skip
        self.guards: list[Guard] = [Stabilise(settings.stabiliser)]
        self.hooks: list[FleetHook] = []
        if self.placement is not None:
            self.guards.append(ObeyPool(self.placement, settings.stabiliser.min_dwell_s))
        if self.canary is not None:
            self.guards.append(Canary(self.canary))
        self.guards.append(DrafterFreeHold())
        if gear_modes is not None:
            self.hooks.append(GearModeHook(gear_modes, self.metrics, self.placement))
        if self.placement is not None:
            self.hooks.append(PlacementHook(self.placement, settings.policy.k_tiers, gear_modes))
        self.hooks.append(self.attribution)

    def _runtimes(self, fleet: FleetConfig, profiles: Mapping[str, Profile]) -> dict[str, WorkerRuntime]:
        """Each worker's runtime, with its own model's profile (each profile loaded once)."""
        loaded, now, out = dict(profiles), self.clock.monotonic(), {}
        for w in fleet.workers:
            name = fleet.profile_of(w.id)
            if name not in loaded:
                loaded[name] = load_profile(name)
            profile = loaded[name]
            est = WorkerEstimator(w.id, profile, min(w.drafter.k_max, profile.drafter.k_max), self.settings.estimator)
            targets = tpot_target(w.model, self.tenants), ttft_target(w.model, self.tenants)
            out[w.id] = WorkerRuntime(w, profile, est, targets[0], now, ttft_target_s=targets[1])
        return out

    # ------------------------------------------------------------------------------------------- one tick
    async def tick(self) -> None:
        """One pass over every worker (concurrently), then the fleet hooks; a failure never stops the others."""
        with self.metrics.tick_duration.time():
            try:
                await self.refresh_tenants()
            except Exception as exc:  # a store hiccup: the tenants last read stay in force
                self.metrics.tick_failures.inc()
                log.warning("reading the run-time tenants failed: %r", exc)
            runtimes = list(self.workers.values())
            results = await asyncio.gather(*(self._tick_worker(rt) for rt in runtimes), return_exceptions=True)
            for hook in self.hooks:
                try:
                    await hook.tick(runtimes)
                except Exception as exc:  # the store, the ledger or a restart: the hook runs again next tick
                    self.metrics.tick_failures.inc()
                    log.warning("%s: %r", hook.failure, exc)
        for rt, res in zip(runtimes, results, strict=True):
            if isinstance(res, BaseException):
                if not isinstance(res, Exception):
                    raise res
                self.metrics.tick_failures.inc()
                log.warning("worker %s: tick failed: %r", rt.config.id, res)

    async def _tick_worker(self, rt: WorkerRuntime) -> None:
        now = self.clock.monotonic()
        est = await self.collector.collect(rt, now)
        drafter = self.gear_modes is None or self.gear_modes.drafter_loaded(rt.config.id)
        decision = decide_worker(
            rt, est, config=self.settings.policy, tpot_target_s=self._tpot_target(rt), drafter_loaded=drafter
        )
        started = rt.stab is None
        if rt.stab is None:
            rt.stab = initial_state(rt.k_applied if rt.k_applied is not None else est.k_max, now)
        step = govern(self.guards, rt, Proposal(now, est, decision, rt.stab, started, drafter))
        rt.stab, rt.estimate, rt.decision, rt.action = step.state, est, decision, step.action
        record_action(rt.config.id, step.action, decision, self.metrics)
        restarting = self.gear_modes is not None and self.gear_modes.phase(rt.config.id) is Phase.RESTARTING
        if not self.settings.dry_run and drafter and not restarting:  # also when stale: holding renews the lease
            await self.pusher.push(rt, now)
        account(rt, self.metrics)
        await self.store.publish_worker_state(self.worker_state(rt), ttl_s=self.settings.state_ttl_s)

    def _tpot_target(self, rt: WorkerRuntime) -> float | None:
        """The worker's TPOT target: its pool's under a plan with several pools, else its model's tiers'."""
        if self.placement is None:
            return rt.tpot_target_s
        return self.placement.tpot_target(rt.config.id, rt.config.model, rt.tpot_target_s)

    async def refresh_tenants(self) -> None:
        """Put in force the tenants file merged with the run-time changes in the store (``fleet.tenants``): a tenant
        created or re-tiered through the admin API moves its model's TPOT/TTFT targets from this tick on."""
        tenants = (await read_merged(self.tenants_file, self.store)).tenants
        if tenants == self.tenants:
            return
        self.tenants = tenants
        for rt in self.workers.values():
            rt.tpot_target_s = tpot_target(rt.config.model, tenants)
            rt.ttft_target_s = ttft_target(rt.config.model, tenants)
        if self.placement is not None:
            self.placement.tenants = tenants

    def worker_state(self, rt: WorkerRuntime) -> WorkerState:
        """What the gateway reads of ``rt`` now (``controller.tick.report.worker_state``)."""
        return worker_state(rt, updated_at=self.clock.wall())

    async def attribute_tenants(self) -> dict[str, float]:
        """Split the workers' cost since the last call over tenants now (``controller.fleet_hooks.CostAttribution``)
        and add it to the per-tenant cost metric. Returns tenant → USD."""
        return await self.attribution.attribute(list(self.workers.values()))

    # ------------------------------------------------------------------------------------ leadership + pacing
    async def lead_once(self) -> bool:
        """Take or renew the leader lease; tick if held. True when this replica led this tick."""
        leader = await self.store.acquire_lease(
            self.settings.leader_lease_name, self.holder_id, ttl_s=self.settings.leader_lease_s
        )
        if leader and not self.is_leader:
            log.info("controller %s: became leader", self.holder_id)
            for rt in self.workers.values():  # another leader may have moved versions and leases meanwhile
                rt.version, rt.renew_at_s, rt.rebase = None, 0.0, True
        self.is_leader = leader
        self.metrics.leader.set(1 if leader else 0)
        if leader:
            await self.tick()
        return leader

    async def run(self, stop: asyncio.Event) -> None:
        """Lead (or stand by) every ``tick_s`` until ``stop`` is set; never dies of a transient error."""
        failures = 0
        try:
            while not stop.is_set():
                started = self.clock.monotonic()
                try:
                    await self.lead_once()
                    failures = 0
                except Exception as exc:
                    failures += 1
                    self.metrics.tick_failures.inc()
                    log.warning("controller tick failed (%d in a row): %r", failures, exc)
                delay = self.settings.tick_s * (2 ** min(failures, 10) if failures else 1)
                delay = min(delay, max(self.settings.max_backoff_s, self.settings.tick_s))
                await self._sleep_or_stop(stop, max(delay - (self.clock.monotonic() - started), 0.0))
        finally:
            if self.is_leader:
                self.is_leader = False
                self.metrics.leader.set(0)
                try:
                    await self.store.release_lease(self.settings.leader_lease_name, self.holder_id)
                except Exception as exc:  # a dead store lets the lease expire on its own
                    log.warning("releasing the leader lease failed: %r", exc)

    async def _sleep_or_stop(self, stop: asyncio.Event, seconds: float) -> None:
        sleeper = asyncio.ensure_future(self.clock.sleep(seconds))
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (sleeper, stopper):
                t.cancel()
