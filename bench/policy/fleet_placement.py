"""Placing policies in the lab: the fleet planner online, and a fixed placement.

- ``FleetPlacementPolicy`` ("fleet-placement"): every ``PlannerConfig.period_s`` it measures what the
  controller can measure and runs ``controller.planner.plan_fleet`` on it; the lab routes by the plan through
  the gateway's own placement filter (``bench.policy.routing``). Pools the plan gives a k run it (a PUT with a
  lease, as the per-worker loop would apply its pool's gear) with the pool's per-worker cap; workers whose pool
  has k None (one pool: today's behaviour) are run by the per-worker controller (``ControllerPolicy``).
  Its inputs, per traffic class over the last ``WINDOW_S``: arrivals per second and mean prompt and
  requested output tokens (the gateway's usage records: tier, workload, arrival, lengths), and the accepted
  length per class estimated from each worker's speculation counters and the class mix routed to it
  (``controller.planner.estimate_acceptance``, the profile's classes as the prior).
- ``StaticPlacement``: a fixed plan (each pool's k and cap) and each class's share per pool, for the whole
  run (``bench.policy.placement`` searches these in hindsight).

A per-worker cap is modelled as the engine's batch limit (``max_num_seqs`` lowered to the cap): the requests
above it wait, as the gateway's overload gate would hold them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bench.policy.controller_policy import ControllerPolicy
from bench.policy.lab_policy import LabContext, Passive
from bench.policy.routing import Placement
from controller.planner import (
    ClassLoad,
    PlannerConfig,
    PlannerInput,
    WorkerAcceptance,
    estimate_acceptance,
    plan_fleet,
    prior_accepted_length,
)
from fleet.config import TierConfig
from fleet.perf import Profile, load_profile
from fleet.plan import FleetPlan, PoolPlan, TrafficClass, traffic_class
from fleet.speculation import Schedule, SpeculationUpdate, uniform_schedule
from fleet.store.protocol import WorkerState
from workers.sim.virtual import TickContext, VirtualWorker

WINDOW_S = 40.0
"""Seconds of recent arrivals the planner's per-class load is measured over."""
LEASE_S = 3600.0
STATIC_TTL_S = 1e9
"""A static placement's plan never goes stale."""


def pin(workers: Sequence[VirtualWorker], plan: FleetPlan, max_num_seqs: int) -> None:
    """Run each pool's k (pools with k None are left alone) and each pool's cap on its workers' engines."""
    for pool in plan.pools:
        for w in workers:
            if w.worker_id not in pool.workers:
                continue
            w.engine.max_num_seqs = pool.max_concurrency or max_num_seqs
            if pool.k is not None:  # also when it runs that k now: under a controller's lease, which would lapse
                k = min(pool.k, w.control.k_max)
                w.control.apply(SpeculationUpdate(k=k, version=w.control.version + 1, lease_seconds=LEASE_S))


@dataclass
class StaticPlacement(Passive):
    """A fixed placement: ``plan`` (pools, their k and caps) and ``shares`` (class → pool → share)."""

    name: str
    plan: FleetPlan
    shares: Mapping[TrafficClass, Mapping[str, float]]
    _placement: Placement | None = None

    def start_schedule(self, *, k_max: int, max_num_seqs: int) -> Schedule:
        return uniform_schedule(k_max, max_num_seqs=max_num_seqs)

    def bind(self, workers: Sequence[VirtualWorker], ctx: LabContext) -> None:
        pin(workers, self.plan, workers[0].control.max_num_seqs)
        self._placement = Placement(self.plan, self.shares)

    def placement(self) -> Placement | None:
        return self._placement


@dataclass
class _Counters:
    k: int
    drafts: int
    accepted: int


@dataclass
class FleetPlacementPolicy:
    """The fleet planner above the per-worker controller (see the module docstring)."""

    name: str = "fleet-placement"
    config: PlannerConfig = field(default_factory=PlannerConfig)
    plan: FleetPlan | None = None
    plans: list[FleetPlan] = field(default_factory=list)
    """Every plan whose pools changed, in order (for reports and tests)."""
    _workers: Sequence[VirtualWorker] = ()
    _ctx: LabContext | None = None
    _profile: Profile | None = None
    _seqs: int = 0
    _since: float = 0.0
    _next_plan_s: float = 0.0
    _controllers: dict[frozenset[str], ControllerPolicy] = field(default_factory=dict)
    _active: ControllerPolicy | None = None
    _counters: dict[str, _Counters] = field(default_factory=dict)
    _states: dict[str, WorkerState] = field(default_factory=dict)

    def start_schedule(self, *, k_max: int, max_num_seqs: int) -> Schedule:
        return uniform_schedule(k_max, max_num_seqs=max_num_seqs)

    def bind(self, workers: Sequence[VirtualWorker], ctx: LabContext) -> None:
        self._workers, self._ctx = workers, ctx
        self._profile = load_profile(ctx.profile_name)
        self._seqs = workers[0].control.max_num_seqs
        self._next_plan_s = self.config.period_s
        self._counters = {
            w.worker_id: _Counters(w.control.k_for(1), w.stats.num_drafts, w.stats.num_accepted_tokens) for w in workers
        }
        self._activate(frozenset(w.worker_id for w in workers))

    def _activate(self, ids: frozenset[str]) -> None:
        """Let the per-worker controller run ``ids`` (one controller per distinct set, kept for reuse)."""
        if not ids:
            self._active = None
            return
        if ids not in self._controllers:
            inner = ControllerPolicy(name=self.name)
            assert self._ctx is not None
            inner.bind([w for w in self._workers if w.worker_id in ids], self._ctx)
            self._controllers[ids] = inner
        self._active = self._controllers[ids]

    def on_tick(self, tick: TickContext) -> None:
        if tick.now_s + 1e-9 >= self._next_plan_s:
            self._next_plan_s = tick.now_s + self.config.period_s
            self._replan(tick)
        elif self.plan is not None and not self.plan.fresh(tick.clock.wall()):
            self._replan(tick)
        if self._active is not None:
            self._active.on_tick(tick)
        self._publish_pinned(tick)

    def _replan(self, tick: TickContext) -> None:
        assert self._profile is not None
        assert self._ctx is not None
        inp = PlannerInput(
            model=self._workers[0].model_name,
            workers=tuple(w.worker_id for w in self._workers),
            profile=self._profile,
            classes=tuple(self._class_loads(tick)),
            now=tick.clock.wall(),
            max_num_seqs=self._seqs,
            current=self.plan,
            current_since=self._since,
        )
        if not inp.classes:
            return
        plan = plan_fleet(inp, self.config)
        if self.plan is None or plan.version != self.plan.version:
            self._since = inp.now
            self.plans.append(plan)
            pin(self._workers, plan, self._seqs)
            free = {w for p in plan.pools if p.k is None for w in p.workers}
            self._activate(frozenset(free))
        self.plan = plan

    def _class_loads(self, tick: TickContext) -> list[ClassLoad]:
        """Per class over the last ``WINDOW_S``: rate and lengths from the arrivals, acceptance from the counters."""
        assert self._profile is not None
        assert self._ctx is not None
        now = tick.now_s
        span = min(WINDOW_S, now)
        if span <= 0:
            return []
        recent = [r for r in tick.records.requests if now - span <= r.arrival_s < now]
        groups: dict[TrafficClass, list[tuple[int, int, str, str]]] = {}
        for r in recent:
            groups.setdefault(traffic_class(r.tag, r.workload), []).append(
                (r.prompt_tokens, r.max_tokens, r.worker_id, r.tag)
            )
        priors: dict[TrafficClass, tuple[float, ...]] = {}
        for cls, rows in groups.items():
            context = sum(p + o / 2 for p, o, _, _ in rows) / len(rows)
            priors[cls] = prior_accepted_length(self._profile, cls.partition("/")[2], context)
        estimates = estimate_acceptance(priors, self._observations(groups, priors))
        out = []
        for cls, rows in groups.items():
            tier: TierConfig = self._ctx.tiers[rows[0][3]]
            al, sd = estimates[cls]
            out.append(
                ClassLoad(
                    name=cls,
                    tier=tier,
                    rate_req_s=len(rows) / span,
                    prompt_tokens=sum(p for p, _, _, _ in rows) / len(rows),
                    output_tokens=sum(o for _, o, _, _ in rows) / len(rows),
                    accepted_length=al,
                    accepted_length_sd=sd,
                )
            )
        return out

    def _observations(
        self, groups: Mapping[TrafficClass, list[tuple[int, int, str, str]]], priors: Mapping[str, tuple[float, ...]]
    ) -> list[WorkerAcceptance]:
        """Each worker's accepted drafts per request-step since the last plan (at one k), with its class mix."""
        out = []
        for w in self._workers:
            stats, k = w.stats, w.control.k_for(1)
            last = self._counters.get(w.worker_id)
            self._counters[w.worker_id] = _Counters(k, stats.num_drafts, stats.num_accepted_tokens)
            if last is None or last.k != k or k == 0 or stats.num_drafts <= last.drafts:
                continue
            steps: dict[TrafficClass, float] = {}
            for cls, rows in groups.items():
                n = sum(o for _, o, wid, _ in rows if wid == w.worker_id)
                if n:
                    steps[cls] = n / priors[cls][min(k, len(priors[cls]) - 1)]
            total = sum(steps.values())
            if total <= 0:
                continue
            per_step = (stats.num_accepted_tokens - last.accepted) / (stats.num_drafts - last.drafts)
            out.append(WorkerAcceptance(k, per_step, {c: s / total for c, s in steps.items()}))
        return out

    def _publish_pinned(self, tick: TickContext) -> None:
        """What the controller would publish for workers at a pool's k: their k, load and accepted length."""
        self._states = dict(self._active.published_states()) if self._active is not None else {}
        plan = self.plan
        if plan is None:
            return
        for w in self._workers:
            pool: PoolPlan | None = plan.pool_of_worker(w.worker_id)
            if pool is None or pool.k is None:
                continue
            stats = w.stats
            al = 1.0 + stats.num_accepted_tokens / stats.num_drafts if stats.num_drafts else 1.0
            self._states[w.worker_id] = WorkerState(
                worker_id=w.worker_id,
                model=w.model_name,
                k_desired=pool.k,
                k_applied=w.control.k_for(1),
                accepted_length=al,
                running=stats.running,
                waiting=stats.waiting,
                kv_usage=stats.kv_usage,
                updated_at=tick.clock.wall(),
            )

    def published_states(self) -> Mapping[str, WorkerState]:
        return self._states

    def placement(self) -> Placement | None:
        return Placement(self.plan) if self.plan is not None else None

    def close(self) -> None:
        for inner in self._controllers.values():
            inner.close()
