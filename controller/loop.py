"""The control loop: per worker, every tick, scrape → window → estimator → policy → stabiliser → actuator,
then cost and publication (DESIGN §5). One leader at a time through the store's lease (HA).

The loop never dies of a transient error (STYLE 10): each worker's tick is isolated, a failing tick is
counted and retried after an exponential back-off, and a failing worker is only marked stale.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field

from controller.actuator import ActuationError, Actuator
from controller.adaptive import cap_decision
from controller.canary import CanaryGate
from controller.cost import WorkerCost, attribute_to_tenants, prefill_seconds_per_token, worker_cost
from controller.estimator import Estimate, WorkerEstimator
from controller.full_speed import gear_schedule
from controller.gear_mode import GearModes, GearObservation
from controller.metrics import ControllerMetrics
from controller.placement import FleetPlacement, WorkerSample, obey_pool, worker_gears
from controller.policy import Decision, decide
from controller.settings import ControllerSettings
from controller.sources import MetricsSource, SourceError
from controller.stabiliser import Action, ActionKind, StabiliserState, initial_state, stabilise
from controller.window import Window, WindowBreak, window_between
from fleet.clock import Clock
from fleet.config import FleetConfig, TenantsConfig, WorkerConfig
from fleet.perf import Profile, load_profile, predict_step
from fleet.scrape import COUNTER_FIELDS, WorkerScrape
from fleet.speculation import (
    FullSpeed,
    Schedule,
    ScheduleError,
    SpeculationState,
    SpeculationUpdate,
    check_full_speed,
)
from fleet.store.protocol import Store, UsageRecord, WorkerState
from fleet.tenants import read_merged
from fleet.worker_mode import Phase

log = logging.getLogger("gearshift.controller")


def tpot_target(model: str, tenants: TenantsConfig) -> float | None:
    """The tightest TPOT target among the tiers of tenants allowed to use ``model`` (seconds; None: none)."""
    targets = [
        tier.tpot_target_s
        for t in tenants.tenants
        if t.allows(model) and (tier := tenants.tiers[t.tier]).tpot_target_s is not None
    ]
    return min(targets) if targets else None


def ttft_target(model: str, tenants: TenantsConfig) -> float | None:
    """The tightest TTFT target among the tiers of tenants allowed to use ``model`` (seconds; None: none)."""
    targets = [
        tier.ttft_target_s
        for t in tenants.tenants
        if t.allows(model) and (tier := tenants.tiers[t.tier]).ttft_target_s is not None
    ]
    return min(targets) if targets else None


@dataclass
class WorkerRuntime:
    """The controller's memory of one worker."""

    config: WorkerConfig
    profile: Profile
    estimator: WorkerEstimator
    tpot_target_s: float | None
    first_seen_s: float
    ttft_target_s: float | None = None
    """The tightest TTFT target of the tiers that may use the worker's model, seconds (None: none)."""
    prev: WorkerScrape | None = None
    last_ok_s: float | None = None
    stab: StabiliserState | None = None
    version: int | None = None
    k_applied: int | None = None
    schedule_applied: Schedule | None = None
    """The worker's applied schedule, as its last GET, PUT or scrape showed it."""
    lapsed: bool = False
    """The worker's last GET showed a version without a lease: it fell back to its start-up schedule, so the
    applied version names a schedule it no longer runs and the next PUT needs a new version."""
    full_speed: FullSpeed | None = None
    """What the worker advertises it runs at full speed (``SpeculationState.full_speed``), read with its version
    on the first GET and again after it restarts; None: every k at every batch size."""
    max_num_seqs: int | None = None
    """The worker's largest batch, from its start-up schedule (None until its first GET)."""
    renew_at_s: float = 0.0
    rebase: bool = False
    window: Window | None = None
    estimate: Estimate | None = None
    decision: Decision | None = None
    action: Action | None = None
    cost: WorkerCost | None = None
    savings_usd: float = 0.0
    usd_since_attribution: float = 0.0
    """The worker's cost since the last tenant attribution, USD (all time, whether or not a window was usable)."""
    elapsed_s: float = 0.0
    """Seconds between the last two successful scrapes."""
    stale_since_s: float | None = None
    switches: list[tuple[float, int]] = field(default_factory=list)
    """``(controller time, k)`` for every applied change (for reports and flap checks)."""
    drafter_loaded: bool = True
    """Runs with its drafter (``controller.gear_mode``); a drafter-free worker is held at k = 0, never actuated."""

    @property
    def k_desired(self) -> int | None:
        return self.stab.k if self.stab else None


def _restarted(prev: WorkerScrape, cur: WorkerScrape, version: int | None) -> bool:
    """The worker restarted between two scrapes: a counter went backwards, or its schedule version did."""
    if any(getattr(cur, name) < getattr(prev, name) for name in COUNTER_FIELDS):
        return True
    return cur.spec_version is not None and version is not None and cur.spec_version < version


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
        """``gear_modes``: the drafter-free gear's moves (None: every worker keeps the mode it was started in)."""
        self.settings = settings
        self.gear_modes = gear_modes
        self.source = source
        self.actuator = actuator
        self.store = store
        self.clock = clock
        self.metrics = metrics or ControllerMetrics()
        self.holder_id = holder_id
        self.is_leader = False
        now = clock.monotonic()
        loaded: dict[str, Profile] = dict(profiles or {})
        self.workers: dict[str, WorkerRuntime] = {}
        for w in fleet.workers:
            model = fleet.model(w.model)
            assert model is not None  # FleetConfig validates worker models
            if model.profile not in loaded:
                loaded[model.profile] = load_profile(model.profile)
            profile = loaded[model.profile]
            k_max = min(w.drafter.k_max, profile.drafter.k_max)
            est = WorkerEstimator(w.id, profile, k_max, settings.estimator)
            self.workers[w.id] = WorkerRuntime(
                w, profile, est, tpot_target(w.model, tenants), now, ttft_target_s=ttft_target(w.model, tenants)
            )
        self.tenants_file = tenants
        self.tenants = tenants
        """The tenants in force: the file merged with the store's run-time changes, re-read every tick."""
        self._attributed_until = clock.wall()
        self.canary = (
            CanaryGate(settings.canary_worker, settings.canary_ticks) if settings.canary_worker is not None else None
        )
        self.placement = (
            FleetPlacement(settings.placement, store=store, clock=clock, tenants=tenants, metrics=self.metrics)
            if settings.placement.enabled
            else None
        )

    # ------------------------------------------------------------------------------------------- one tick
    async def tick(self) -> None:
        """One pass over every worker (concurrently); a worker's failure never stops the others."""
        with self.metrics.tick_duration.time():
            try:
                await self.refresh_tenants()
            except Exception as exc:  # a store hiccup: the tenants last read stay in force
                self.metrics.tick_failures.inc()
                log.warning("reading the run-time tenants failed: %r", exc)
            results = await asyncio.gather(
                *(self._tick_worker(rt) for rt in self.workers.values()), return_exceptions=True
            )
            if self.gear_modes is not None:
                try:
                    await self.gear_modes.tick([self._gear_observation(rt) for rt in self.workers.values()])
                    self.gear_modes.export(self.metrics)
                except Exception as exc:  # a store or restart-control hiccup: the moves resume next tick
                    self.metrics.tick_failures.inc()
                    log.warning("drafter-free gear tick failed: %r", exc)
            if self.placement is not None:
                try:
                    await self.placement.tick([self._placement_sample(rt) for rt in self.workers.values()])
                except Exception as exc:  # the ledger or the store: the plan is made again next period
                    self.metrics.tick_failures.inc()
                    log.warning("fleet placement tick failed: %r", exc)
            if self.clock.wall() - self._attributed_until >= self.settings.tenant_interval_s:
                try:
                    await self.attribute_tenants()
                except Exception as exc:  # the ledger is best effort: retried next interval
                    self.metrics.tick_failures.inc()
                    log.warning("tenant cost attribution failed: %r", exc)
        for rt, res in zip(self.workers.values(), results, strict=True):
            if isinstance(res, BaseException):
                if not isinstance(res, Exception):
                    raise res
                self.metrics.tick_failures.inc()
                log.warning("worker %s: tick failed: %r", rt.config.id, res)

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

    async def _tick_worker(self, rt: WorkerRuntime) -> None:
        now = self.clock.monotonic()
        scrape = await self._scrape(rt, now)
        if scrape is not None and rt.version is None:
            await self._learn_version(rt)
        stale = scrape is None
        if rt.k_applied is not None and rt.estimator.windows == 0:
            rt.estimator.k_current = rt.k_applied  # before the first window, trust what the worker reports
        stale_for = now - (rt.last_ok_s if rt.last_ok_s is not None else rt.first_seen_s)
        est = rt.estimator.estimate(stale=stale, stale_for_s=stale_for if stale else 0.0)
        drafter = self.gear_modes is None or self.gear_modes.drafter_loaded(rt.config.id)
        if drafter != rt.drafter_loaded:
            rt.drafter_loaded, rt.stab = drafter, None  # restarted in the other mode: start from what it runs
        decision = decide(
            est,
            rt.profile,
            tpot_target_s=self._tpot_target(rt),
            ttft_target_s=rt.ttft_target_s,
            config=self.settings.policy,
            full_speed=rt.full_speed if drafter else None,  # drafter-free: would a k > 0 pay with the drafter?
            drafter_loaded=drafter,
        )
        if est.adaptive:
            decision = cap_decision(est, decision)  # the engine sizes verification itself: choose its cap
        if self.canary is not None and rt.decision is not None:
            self.canary.observe(rt.config.id, rt.window, rt.decision.candidate(rt.window.k) if rt.window else None)
        if rt.stab is None:
            rt.stab = initial_state(rt.k_applied if rt.k_applied is not None else est.k_max, now)
            if self.canary is not None:
                self.canary.validated.add(rt.stab.k)
        new_state, action = stabilise(rt.stab, decision, est, now, self.settings.stabiliser)
        new_state, action = self._follow_plan(rt, new_state, action, decision, est, now)
        if self.canary is not None and not self.canary.allows(rt.config.id, action):
            action = Action(
                rt.stab.k, ActionKind.HOLD, f"canary: k={action.k} not yet validated on {self.canary.canary_id}"
            )
        else:
            rt.stab = new_state
        if not drafter:
            rt.stab, action = initial_state(0, now), Action(0, ActionKind.HOLD, "drafter-free: k = 0 (no drafter)")
        rt.estimate, rt.decision, rt.action = est, decision, action
        if action.changed:
            log.info("worker %s: %s → k=%d: %s", rt.config.id, action.kind, action.k, action.reason)
        self.metrics.decisions.labels(rt.config.id, action.kind.value, decision.risk.value).inc()
        restarting = self.gear_modes is not None and self.gear_modes.phase(rt.config.id) is Phase.RESTARTING
        if not self.settings.dry_run and drafter and not restarting:  # also when stale: holding renews the lease
            await self._actuate(rt, now)
        self._account(rt)
        await self._publish(rt)

    # ------------------------------------------------------------------------------------ fleet placement
    def _tpot_target(self, rt: WorkerRuntime) -> float | None:
        """The worker's TPOT target: its pool's under a plan with several pools, else its model's tiers'."""
        if self.placement is None:
            return rt.tpot_target_s
        return self.placement.tpot_target(rt.config.id, rt.config.model, rt.tpot_target_s)

    def _follow_plan(
        self, rt: WorkerRuntime, state: StabiliserState, action: Action, decision: Decision, est: Estimate, now: float
    ) -> tuple[StabiliserState, Action]:
        """The stabiliser's step, made to follow the worker's pool gear (``controller.placement.obey_pool``)."""
        found = self.placement.pool_of(rt.config.id, rt.config.model) if self.placement is not None else None
        if found is None:
            return state, action
        dwell = self.settings.stabiliser.min_dwell_s
        return obey_pool(state, action, decision, est, found[0], now=now, min_dwell_s=dwell)

    def _placement_sample(self, rt: WorkerRuntime) -> WorkerSample:
        k_max = min(rt.config.drafter.k_max, rt.profile.drafter.k_max)
        return WorkerSample(
            worker_id=rt.config.id,
            model=rt.config.model,
            profile=rt.profile,
            max_num_seqs=rt.max_num_seqs or rt.config.max_num_seqs,
            gears=worker_gears(self.settings.policy.k_tiers, k_max, rt.full_speed),
            estimate=rt.estimate,
        )

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
        rt.elapsed_s = scrape.at_s - rt.prev.at_s if rt.prev is not None else 0.0
        if rt.prev is not None and not rt.rebase:
            try:
                rt.window = window_between(rt.prev, scrape, k=rt.k_applied or 0)
                rt.estimator.update(rt.window)
            except WindowBreak as exc:
                log.debug("worker %s: window skipped: %s", wid, exc)
        restarted = rt.prev is not None and _restarted(rt.prev, scrape, rt.version)
        rt.prev, rt.rebase, rt.last_ok_s = scrape, False, now
        if scrape.spec_k is not None:
            rt.k_applied = scrape.spec_k
            rt.schedule_applied = scrape.spec_schedule
        if restarted:
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
        self._learn_state(rt, state)
        full_speed = None if state.full_speed is None else tuple((k, lo, hi) for k, lo, hi in state.full_speed)
        if full_speed != rt.full_speed:
            log.info("worker %s: full-speed set %s", rt.config.id, full_speed if full_speed is not None else "all")
        rt.full_speed = full_speed
        rt.max_num_seqs = state.fallback_schedule[-1][1] if state.fallback_schedule else None

    @staticmethod
    def _learn_state(rt: WorkerRuntime, state: SpeculationState) -> None:
        rt.version = state.version
        rt.lapsed = state.version > 0 and state.lease_expires_at is None
        rt.k_applied = max(row[2] for row in state.schedule)
        rt.schedule_applied = tuple((lo, hi, k) for lo, hi, k in state.schedule)

    def _desired_schedule(self, rt: WorkerRuntime, k: int) -> Schedule | None:
        """The schedule to PUT for ``k`` on a worker that restricts full speed (None: a plain k)."""
        if rt.full_speed is None:
            return None
        return gear_schedule(k, rt.full_speed, max_num_seqs=rt.max_num_seqs or rt.config.max_num_seqs)

    async def _actuate(self, rt: WorkerRuntime, now: float) -> None:
        if rt.stab is None or rt.version is None:
            return
        schedule = self._desired_schedule(rt, rt.stab.k)
        change = rt.stab.k != rt.k_applied if schedule is None else schedule != rt.schedule_applied
        renew = rt.version > 0 and now >= rt.renew_at_s
        if not change and not renew:
            return
        version = rt.version + 1 if change or rt.lapsed else rt.version
        reason = (rt.action.reason if rt.action is not None else "")[:500]
        lease = self.settings.schedule_lease_s
        if schedule is None:
            update = SpeculationUpdate(k=rt.stab.k, version=version, lease_seconds=lease, reason=reason)
        else:
            try:
                check_full_speed(schedule, rt.full_speed or ())
            except ScheduleError as exc:  # gear_schedule keeps to the advertised set: a bug if it ever fires
                self.metrics.actuation_failures.labels(rt.config.id).inc()
                log.error("worker %s: not sent, outside its full-speed set: %s", rt.config.id, exc)
                return
            rows = [list(row) for row in schedule]
            update = SpeculationUpdate(schedule=rows, version=version, lease_seconds=lease, reason=reason)
        try:
            state = await self.actuator.apply(rt.config, update)
        except ActuationError as exc:
            self.metrics.actuation_failures.labels(rt.config.id).inc()
            log.warning("%s", exc)
            if exc.stale_version:
                rt.version = None  # learn the worker's version again next tick
            return
        self._learn_state(rt, state)
        rt.renew_at_s = now + self.settings.schedule_lease_s / 2
        if change:
            rt.rebase = True  # the next window would straddle the switch
            rt.switches.append((now, rt.stab.k))  # the gear: a full-speed schedule may hold lower k at other sizes

    def _gear_observation(self, rt: WorkerRuntime) -> GearObservation:
        """What the drafter-free gear needs of a worker this tick: capacity is k = 0 at ``max_num_seqs`` (with the
        step correction and the observed prefill per output token), load the goodput predicted at its batch."""
        fresh = rt.stale_since_s is None and rt.prev is not None
        est, decision = rt.estimate, rt.decision
        load = capacity = 0.0
        spec_pays = off_pays = False
        if est is not None and decision is not None:
            current = decision.candidate(rt.stab.k) if rt.stab is not None else None
            load = current.goodput_tok_s if current is not None and est.batch > 0 else 0.0
            held = current.goodput_tok_s if current is not None else 0.0
            off = decision.off.goodput_tok_s if decision.off is not None else 0.0
            off_pays = rt.stab is not None and (rt.stab.k == 0 or (off > held and est.batch > 0))
            seqs = float(rt.max_num_seqs or rt.config.max_num_seqs)
            step = predict_step(
                rt.profile,
                batch=seqs,
                k=0,
                context_per_seq=est.context_per_seq,
                prefill_per_step=est.prefill_per_token * seqs,
            )
            capacity = seqs / (step.total_s * est.step_correction)
            spec_pays = decision.k > 0
        return GearObservation(
            worker_id=rt.config.id,
            fresh=fresh,
            in_flight=rt.prev.running + rt.prev.waiting if fresh and rt.prev is not None else None,
            off_pays=off_pays,
            spec_pays=spec_pays,
            load_tok_s=load,
            capacity_tok_s=capacity,
        )

    # ------------------------------------------------------------------------------------ cost and output
    def _account(self, rt: WorkerRuntime) -> None:
        m, wid = self.metrics, rt.config.id
        rt.usd_since_attribution += rt.config.usd_per_second * rt.elapsed_s
        rt.elapsed_s = 0.0
        est, decision = rt.estimate, rt.decision
        if est is None or decision is None:
            return
        if rt.stab is not None:
            m.k_desired.labels(wid).set(rt.stab.k)
        if rt.k_applied is not None:
            m.k_applied.labels(wid).set(rt.k_applied)
        m.decode_batch.labels(wid).set(est.batch)
        m.step_correction.labels(wid).set(est.step_correction)
        m.overloaded.labels(wid).set(1 if decision.overloaded else 0)
        chosen = decision.candidate(rt.stab.k) if rt.stab else None
        if chosen is not None:
            m.tpot_predicted.labels(wid).set(chosen.tpot_s)
        if est.accepted_length is not None:
            m.accepted_length.labels(wid).set(est.accepted_length)
        if est.step_observed_s is not None:
            m.step_observed.labels(wid).set(est.step_observed_s)
        w = rt.window
        current = decision.candidate(w.k) if w is not None else None
        k0 = decision.candidate(0)
        if w is None or current is None or k0 is None:
            return
        m.step_predicted.labels(wid).set(current.step_s)
        rt.cost = worker_cost(usd_per_s=rt.config.usd_per_second, window=w, current=current, k0=k0, off=decision.off)
        rt.savings_usd += rt.cost.savings_usd
        if rt.cost.usd_per_mtok is not None:
            m.usd_per_mtok.labels(wid).set(rt.cost.usd_per_mtok)
        if rt.cost.usd_per_mtok_k0 is not None:
            m.usd_per_mtok_k0.labels(wid).set(rt.cost.usd_per_mtok_k0)
        m.drafter_share.labels(wid).set(rt.cost.drafter_share)
        m.rejected_share.labels(wid).set(rt.cost.rejected_share)
        m.savings.labels(wid).set(rt.savings_usd)

    def worker_state(self, rt: WorkerRuntime) -> WorkerState:
        """What the gateway reads. ``acceptance_per_pos`` holds a_i = P(draft i accepted), unconditional as in
        DESIGN §3.2, so the expected tokens per request-step at k' is 1 + Σ_{i<k'} a_i."""
        est, decision = rt.estimate, rt.decision
        chosen = decision.candidate(rt.stab.k) if decision is not None and rt.stab is not None else None
        scrape = rt.prev
        return WorkerState(
            worker_id=rt.config.id,
            model=rt.config.model,
            k_desired=rt.k_desired if rt.k_desired is not None else -1,
            k_applied=rt.k_applied if rt.k_applied is not None else -1,
            accepted_length=est.accepted_length or 1.0 if est else 1.0,
            acceptance_per_pos=list(itertools.accumulate(est.conditional, operator.mul)) if est else [],
            tpot_predicted_s=chosen.tpot_s if chosen else None,
            running=scrape.running if scrape else 0.0,
            waiting=scrape.waiting if scrape else 0.0,
            kv_usage=scrape.kv_usage if scrape else 0.0,
            usd_per_mtok=rt.cost.usd_per_mtok if rt.cost else None,
            overloaded=decision.overloaded if decision else False,
            stale=est.stale if est else True,
            reason=rt.action.reason if rt.action else "",
            updated_at=self.clock.wall(),
        )

    async def _publish(self, rt: WorkerRuntime) -> None:
        await self.store.publish_worker_state(self.worker_state(rt), ttl_s=self.settings.state_ttl_s)

    async def attribute_tenants(self) -> dict[str, float]:
        """Split the workers' cost since the last call over tenants by the ledger's records (``controller.cost``)
        and add it to the per-tenant cost metric. Returns tenant → USD."""
        since, until = self._attributed_until, self.clock.wall()
        records: list[UsageRecord] = []
        for tenant in self.tenants.tenants:
            totals = await self.store.usage(tenant.id, since=since, until=until, limit=100_000)
            records.extend(totals.records)
        usd = {wid: rt.usd_since_attribution for wid, rt in self.workers.items()}
        fallback = [rt.decision.candidate(rt.stab.k) for rt in self.workers.values() if rt.decision and rt.stab]
        tpot = next((c.tpot_s for c in fallback if c is not None), 0.02)
        profile = next(iter(self.workers.values())).profile if self.workers else None
        prefill = prefill_seconds_per_token(profile) if profile is not None else 0.0
        shares = attribute_to_tenants(records, usd, prefill_s_per_token=prefill, fallback_tpot_s=tpot)
        for tenant_id, value in shares.items():
            self.metrics.tenant_cost.labels(tenant_id).inc(value)
        for rt in self.workers.values():
            rt.usd_since_attribution = 0.0
        self._attributed_until = until
        return shares

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
