"""Fleet placement in the controller (DESIGN §9): the planning loop above the per-worker loops, and the rule by
which a per-worker loop follows its pool's gear.

**Planning** (``FleetPlacement.tick``, called by the leader's tick). Every ``period_s`` and per model, the
controller measures each traffic class (``"<tier>/<workload>"``) over the last ``class_window_s`` of the usage
ledger: its arrival rate (requests/s), mean prompt and completion tokens. Its accepted length per k is the
profile's prior for its workload corrected by what the workers observed (``controller.planner.
estimate_acceptance``): each worker's observed accepted drafts per step at its k, credited to the classes by the
share of completion tokens each had of what the ledger says that worker served (a proxy for its request-steps),
with the estimate's uncertainty. ``controller.planner.plan_fleet`` (pure: hysteresis and minimum dwell
included) chooses the pools, and the plan is published to the store (``fleet.plan.publish_plan``) with the
per-class acceptance added to ``predicted`` (``accepted_length/<class>`` at its pool's k, k_max for a pool
whose loops choose, and ``accepted_length_sd/<class>``, a fraction). Only the ``max_classes`` busiest classes
of a model are planned (the rest are routed on load alone). A model without ledger traffic gets no plan.

**Following the plan** (``obey_pool``). A worker whose pool has a k runs that k, except when a safety path of
its own loop holds: stale metrics or no window yet, a KV, preemption or acceptance-collapse risk, a probe in
progress or starting, a pending re-probe after a collapse, or — going up — less than the stabiliser's
``min_dwell_s`` since its last change (a safety fast-down is not undone at once). A pool without a k leaves the
loop to choose, against the tightest TPOT target of the pool's tiers (``PoolPlan.tpot_target``). With one pool (one
worker, or one class, or the planner keeping the fleet shared) every loop runs as without placement.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from pydantic import BaseModel, ConfigDict, Field

from controller.estimator import Estimate
from controller.forecast import DAY_S, Forecast, ForecastConfig, forecast
from controller.full_speed import advertised_gears
from controller.metrics import ControllerMetrics
from controller.planner import (
    ClassLoad,
    PlannerConfig,
    PlannerInput,
    WorkerAcceptance,
    estimate_acceptance,
    plan_fleet,
    prior_accepted_length,
)
from controller.policy import Decision, Risk
from controller.stabiliser import Action, ActionKind, StabiliserState
from fleet.clock import Clock
from fleet.config import SpeculationMode, TenantsConfig
from fleet.perf import IdleDrafterMode, Profile
from fleet.plan import FleetPlan, PoolPlan, TrafficClass, class_tier, publish_plan, read_plans, traffic_class
from fleet.speculation import FullSpeed
from fleet.store.protocol import Store, UsageRecord

log = logging.getLogger("gearshift.controller.placement")

_SAFETY = (Risk.KV, Risk.PREEMPTION, Risk.COLLAPSE)


_PLANNER = PlannerConfig()


class PlacementConfig(BaseModel):
    """The planning loop's knobs (``GEARSHIFT_PLACEMENT__…``), defaults from ``controller.planner.PlannerConfig``.
    Seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    """Plan and publish; False leaves every worker to its own loop and the gateways on load alone."""
    period_s: float = Field(_PLANNER.period_s, gt=0)
    min_dwell_s: float = Field(_PLANNER.min_dwell_s, ge=0)
    hysteresis: float = Field(_PLANNER.hysteresis, ge=0)
    ttl_s: float = Field(_PLANNER.ttl_s, gt=0)
    """TTL of a published plan: past it the gateways route on load alone and the loops choose their own k."""
    spill_margin: float = Field(_PLANNER.spill_margin, ge=0, lt=1)
    class_window_s: float = Field(120.0, gt=0)
    """The ledger window a class's rate and lengths are measured over."""
    max_classes: int = Field(16, ge=1)
    """Most traffic classes planned per model (the busiest; a bound on client-chosen workload hints)."""
    forecast: bool = True
    """Size the plan for each class's forecast (``controller.forecast``: the band's upper edge ``restart_s``
    ahead, at least ``period_s``); False: for the rate measured over ``class_window_s``."""
    forecast_window_s: float = Field(60.0, gt=0)
    forecast_windows: int = Field(10, ge=2)
    """The forecast's level and trend are fitted over this many windows of ``forecast_window_s``."""
    horizon_factor: float = Field(_PLANNER.horizon_factor, gt=0)
    """A plan's restarts must repay themselves within this many restart times."""
    move_margin: float = Field(_PLANNER.move_margin, ge=0)

    def planner(self) -> PlannerConfig:
        return PlannerConfig(
            period_s=self.period_s,
            min_dwell_s=self.min_dwell_s,
            hysteresis=self.hysteresis,
            ttl_s=self.ttl_s,
            spill_margin=self.spill_margin,
            horizon_factor=self.horizon_factor,
            move_margin=self.move_margin,
        )

    def forecaster(self) -> ForecastConfig:
        return ForecastConfig(window_s=self.forecast_window_s, windows=self.forecast_windows)


@dataclass(frozen=True, slots=True)
class WorkerSample:
    """What the planner needs from one worker's loop."""

    worker_id: str
    model: str
    profile: Profile
    max_num_seqs: int
    gears: tuple[int, ...]
    """The k this worker may run: the policy's tiers within its k_max, at full speed at some batch."""
    estimate: Estimate | None
    drafter_loaded: bool = True
    """The worker runs with its drafter loaded now."""
    movable: bool = False
    """The drafter-free gear may restart it into the other mode (``controller.gear_mode.GearModes.may_move``)."""
    idle_skip: bool = False
    """It runs the plugin's idle-drafter skip (``fleet.config.DrafterConfig.idle_skip``)."""


def worker_gears(k_tiers: Iterable[int] | None, k_max: int, full_speed: FullSpeed | None) -> tuple[int, ...]:
    """The k a worker's pool may be given (``controller.full_speed.advertised_gears``)."""
    return advertised_gears(k_max, full_speed, k_tiers)


def obey_pool(
    state: StabiliserState,
    action: Action,
    decision: Decision,
    est: Estimate,
    pool: PoolPlan,
    *,
    now: float,
    min_dwell_s: float,
    no_drafts: bool = False,
) -> tuple[StabiliserState, Action]:
    """The stabiliser's ``(state, action)`` made to run ``pool.k`` unless a safety path holds (module docstring).
    ``now`` is the loop's monotonic time. ``no_drafts``: the pool, at k = 0, serves a tier whose ``speculation``
    is ``off``, so no probe may run a k > 0 there (that tier was promised no drafts)."""
    if pool.k is None or est.stale or est.windows == 0 or decision.risk in _SAFETY:
        return state, action
    probing = action.kind is ActionKind.PROBE or state.probe_until_s is not None
    if probing and no_drafts and pool.k == 0:
        why = f"plan: pool {pool.name} k=0 serves speculation: off (no probe)"
        kind = ActionKind.PLAN if state.k else ActionKind.HOLD
        held = replace(state, k=0, since_s=now if state.k else state.since_s, probe_until_s=None, history=())
        return replace(held, last_probe_s=now), Action(0, kind, why)
    if probing:
        return state, action
    if state.reprobe_at_s is not None and now < state.reprobe_at_s:
        return state, action
    k = min(pool.k, est.k_max)
    if k > state.k and now - state.since_s < min_dwell_s:
        return state, Action(state.k, ActionKind.HOLD, f"plan: pool {pool.name} k={k} after the dwell")
    if k == state.k:
        return replace(state, history=()), Action(k, ActionKind.HOLD, f"plan: pool {pool.name} k={k}")
    return replace(state, k=k, since_s=now, history=()), Action(k, ActionKind.PLAN, f"plan: pool {pool.name} k={k}")


def _class_of(record: UsageRecord, tenants: TenantsConfig) -> tuple[TrafficClass, str] | None:
    """The record's class and tier name (its tier as metered, else its tenant's); None for an unknown tier."""
    tenant = tenants.tenant(record.tenant)
    tier = record.tier or (tenant.tier if tenant is not None else None)
    if tier is None or tier not in tenants.tiers:
        return None
    return traffic_class(tier, record.workload), tier


def planner_input(
    model: str,
    samples: Sequence[WorkerSample],
    records: Iterable[UsageRecord],
    *,
    tenants: TenantsConfig,
    window_s: float,
    now: float,
    max_classes: int,
    current: FleetPlan | None,
    current_since: float,
    forecasts: Mapping[TrafficClass, Forecast] | None = None,
) -> tuple[PlannerInput, dict[TrafficClass, tuple[tuple[float, ...], float]]] | None:
    """The planner's input for ``model`` from its workers and its ledger records of the last ``window_s``
    seconds (older records are left out), with the per-class acceptance estimate (accepted length per k, sd);
    None without traffic. ``forecasts``: per class, what the plan is sized for."""
    mine = [s for s in samples if s.model == model]
    count: dict[TrafficClass, int] = defaultdict(int)
    prompt: dict[TrafficClass, float] = defaultdict(float)
    output: dict[TrafficClass, float] = defaultdict(float)
    tier_of: dict[TrafficClass, str] = {}
    served: dict[str, dict[TrafficClass, float]] = defaultdict(lambda: defaultdict(float))
    for r in records:
        found = _class_of(r, tenants) if r.model == model and r.at >= now - window_s else None
        if found is None:
            continue
        cls, tier_of[cls] = found
        count[cls] += 1
        prompt[cls] += r.prompt_tokens
        output[cls] += r.completion_tokens
        if r.worker_id is not None:
            served[r.worker_id][cls] += r.completion_tokens
    if not mine or not count:
        return None
    kept = sorted(count, key=lambda c: (-count[c], c))[:max_classes]
    profile = mine[0].profile
    context = {c: (prompt[c] + 0.5 * output[c]) / count[c] for c in kept}
    priors = {c: prior_accepted_length(profile, c.partition("/")[2], context[c]) for c in kept}
    observed = []
    for s in mine:
        est, tokens = s.estimate, served.get(s.worker_id, {})
        total = sum(tokens.get(c, 0.0) for c in kept)
        if est is None or est.accepted_length is None or est.k_current <= 0 or total <= 0:
            continue
        shares = {c: tokens[c] / total for c in kept if tokens.get(c, 0.0) > 0}
        observed.append(WorkerAcceptance(k=est.k_current, accepted_per_step=est.accepted_length - 1, shares=shares))
    acceptance = estimate_acceptance(priors, observed)
    classes = tuple(
        ClassLoad(
            name=c,
            tier=tenants.tiers[tier_of[c]],
            rate_req_s=count[c] / window_s,
            prompt_tokens=prompt[c] / count[c],
            output_tokens=output[c] / count[c],
            accepted_length=acceptance[c][0],
            accepted_length_sd=acceptance[c][1],
        )
        for c in kept
    )
    gears = sorted(set.intersection(*(set(s.gears) for s in mine)))
    inp = PlannerInput(
        model=model,
        workers=tuple(s.worker_id for s in mine),
        profile=profile,
        classes=classes,
        now=now,
        max_num_seqs=min(s.max_num_seqs for s in mine),
        current=current,
        current_since=current_since,
        gears=tuple(gears) or (0,),
        modes={s.worker_id: "loaded" if s.drafter_loaded else "off" for s in mine},
        movable=frozenset(s.worker_id for s in mine if s.movable),
        restart_s=profile.serving.restart_s or 0.0,
        forecast={c: f.record() for c, f in (forecasts or {}).items() if c in kept},
    )
    return inp, acceptance


def _with_acceptance(plan: FleetPlan, acceptance: Mapping[TrafficClass, tuple[tuple[float, ...], float]]) -> FleetPlan:
    """``plan`` with each planned class's accepted length at its pool's k (k_max for a free pool) and its sd."""
    extra: dict[str, float] = {}
    for cls, (al, sd) in acceptance.items():
        pools = plan.pools_for(cls)
        k = pools[0].k if pools and pools[0].k is not None else len(al) - 1
        extra[f"accepted_length/{cls}"] = round(al[min(k, len(al) - 1)], 4)
        extra[f"accepted_length_sd/{cls}"] = round(sd, 4)
    return plan.model_copy(update={"predicted": {**plan.predicted, **extra}})


class FleetPlacement:
    """The planning loop's state: the current plan per model and when its pools were first issued."""

    def __init__(
        self,
        config: PlacementConfig,
        *,
        store: Store,
        clock: Clock,
        tenants: TenantsConfig,
        metrics: ControllerMetrics,
    ) -> None:
        self.config = config
        self._store = store
        self._clock = clock
        self.tenants = tenants
        """The tenants in force (the controller replaces them when they change at run time)."""
        self._metrics = metrics
        self.plans: dict[str, FleetPlan] = {}
        """The plan last published per model (or read from the store, when another leader published since)."""
        self._since: dict[str, tuple[int, float]] = {}
        """Model → (version, Unix s when that version was first issued)."""
        self._exported: set[tuple[str, str]] = set()
        """``(worker, pool)`` label pairs of the pool metric now set."""
        self._next_at = clock.wall() + config.period_s
        self.forecasts: dict[str, dict[TrafficClass, Forecast]] = {}
        """Model → the last forecast per class (``controller.forecast``) from its ledger records."""

    def pool_of(self, worker_id: str, model: str) -> tuple[PoolPlan, FleetPlan] | None:
        """The worker's pool in its model's plan while that plan is fresh, with the plan."""
        plan = self.plans.get(model)
        if plan is None or not plan.fresh(self._clock.wall()):
            return None
        pool = plan.pool_of_worker(worker_id)
        return None if pool is None else (pool, plan)

    def planned_drafter(self, worker_id: str, model: str) -> bool | None:
        """The drafter mode (True: loaded) of the worker's pool in its model's fresh plan (None: no plan)."""
        found = self.pool_of(worker_id, model)
        return None if found is None else found[0].drafter == "loaded"

    def serves_off(self, pool: PoolPlan) -> bool:
        """Whether ``pool`` serves a tier whose ``speculation`` is ``off``."""
        tiers = self.tenants.tiers
        return any((t := tiers.get(class_tier(c))) is not None and t.speculation is SpeculationMode.OFF
                   for c in pool.classes)  # fmt: skip

    def tpot_target(self, worker_id: str, model: str, default: float | None) -> float | None:
        """The TPOT target the worker's loop decides against: its pool's when the plan has several pools."""
        found = self.pool_of(worker_id, model)
        if found is None or len(found[1].pools) < 2:
            return default
        return found[0].tpot_target(self.tenants.tiers)

    async def tick(self, samples: Sequence[WorkerSample]) -> None:
        """Plan and publish every model once ``period_s`` has passed since the last time (leader only)."""
        now = self._clock.wall()
        if not self.config.enabled or now < self._next_at:
            return
        self._next_at = now + self.config.period_s
        for model, stored in (await read_plans(self._store)).items():
            mine = self.plans.get(model)
            if mine is None or stored.version > mine.version:  # a leader before us: continue its plan
                self.plans[model] = stored
                self._since[model] = (stored.version, stored.issued_at)
        cfg = self.config
        span = max(cfg.class_window_s, cfg.forecast_window_s * cfg.forecast_windows)
        records = await self._store.ledger(since=now - span, until=now, limit=100_000)
        yesterday: Sequence[UsageRecord] = ()
        if cfg.forecast:
            yesterday = await self._store.ledger(
                since=now - DAY_S - cfg.forecast_window_s, until=now - DAY_S + self._horizon(samples), limit=100_000
            )
        for model in sorted({s.model for s in samples}):
            if cfg.forecast:
                ledger = [r for r in (*yesterday, *records) if r.model == model]
                horizon = self._horizon([s for s in samples if s.model == model])
                self.forecasts[model] = forecast(ledger, now=now, horizon_s=horizon, config=cfg.forecaster())
            await self._plan_model(model, samples, records, now)

    def _horizon(self, samples: Sequence[WorkerSample]) -> float:
        """How far ahead the plan is sized: a restart's time (the load when a move started now completes), at
        least one planning period, seconds."""
        return max([self.config.period_s, *(s.profile.serving.restart_s or 0.0 for s in samples)])

    async def _plan_model(
        self, model: str, samples: Sequence[WorkerSample], records: Sequence[UsageRecord], now: float
    ) -> None:
        current = self.plans.get(model)
        version, since = self._since.get(model, (-1, now))
        built = planner_input(
            model, samples, records, tenants=self.tenants, window_s=self.config.class_window_s, now=now,
            max_classes=self.config.max_classes, current=current, current_since=since,
            forecasts=self.forecasts.get(model),
        )  # fmt: skip
        if built is None:
            return
        inp, acceptance = built
        mine = [s for s in samples if s.model == model]
        idle = IdleDrafterMode.PLUGIN if mine and all(s.idle_skip for s in mine) else IdleDrafterMode.STOCK
        plan = _with_acceptance(plan_fleet(inp, replace(self.config.planner(), idle_drafter=idle)), acceptance)
        await publish_plan(self._store, plan)
        if plan.version != version:
            log.info("model %s: plan v%d: %s", model, plan.version, plan.reason)
            self._since[model] = (plan.version, now)
        self.plans[model] = plan
        self._export(plan)

    def _export(self, plan: FleetPlan) -> None:
        m = self._metrics
        m.plan_version.labels(plan.model).set(plan.version)
        m.plan_goodput.labels(plan.model).set(plan.predicted.get("goodput_tok_s", 0.0))
        members = {(w, p.name) for p in plan.pools for w in p.workers}
        model_workers = {w for p in plan.pools for w in p.workers}
        for pair in {pr for pr in self._exported if pr[0] in model_workers} - members:
            m.worker_pool.remove(*pair)
            self._exported.discard(pair)
        for pair in members:
            m.worker_pool.labels(*pair).set(1)
        self._exported |= members
