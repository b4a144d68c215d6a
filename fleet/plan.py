"""The fleet placement plan (DESIGN §9): which workers serve which traffic classes, at which gear.

The controller's planner writes one ``FleetPlan`` per model to the store; every gateway replica reads it and
routes each request to its class's pool, and each per-worker control loop runs its pool's k. A *traffic class*
is ``"<tier>/<workload>"`` (``traffic_class``); a pool may also list ``"<tier>/*"``, every workload of a tier.

A plan is *fresh* for ``ttl_s`` seconds after ``issued_at``; past that, readers ignore it (the gateway routes
on load alone, the loops choose their own k). The store keeps a plan document for ``STORE_TTL_FACTOR`` × its
TTL, so that ``gearshift controller explain`` can still show a stale plan for what it was.

Issue 25 extends each pool with its drafter mode (``drafter``: loaded or off, a restart apart), a k cap for the
worker loops (``k_cap``), per-worker concurrency caps (``worker_caps``) and the forecast it was planned for
(``forecast``, per traffic class). Compatibility with older gateways, whose records forbid unknown fields: a plan
is stored with its default-valued fields left out (``publish_plan``), so one that uses none of the new fields
reads as before; one that does is refused by an older reader, which then routes on load alone (its safe path),
never followed half-understood.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Annotated, Final, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fleet.config import TierConfig
from fleet.store.protocol import Store

log = logging.getLogger(__name__)

TrafficClass = str
"""``"<tier>/<workload>"``, e.g. ``"interactive/chat"``; ``"<tier>/default"`` when the request had no hint."""

DEFAULT_WORKLOAD: Final = "default"
"""The workload of a request that carries no hint and whose tenant sets no default."""

ANY_WORKLOAD: Final = "*"
"""In a pool's ``classes``, ``"<tier>/*"`` stands for every workload of that tier."""

PLANS_COLLECTION: Final = "plans"
"""Store document collection of the plans, one document per model (its id is the model name)."""

STORE_TTL_FACTOR: Final = 3.0
"""A plan document expires from the store after this many of its own TTLs (readers ignore it after one)."""

SPILL_LIMIT_KEY: Final = "spill_limit/"
"""``FleetPlan.predicted["spill_limit/<pool>"]``, written by the controller's planner (``controller.planner``), read by
the gateway's placement filter (``FleetPlan.spill_limit``)."""

_NAME = r"^[A-Za-z0-9_.-]{1,64}$"


def traffic_class(tier: str, workload: str | None) -> TrafficClass:
    """The traffic class of a request of ``tier`` with workload hint ``workload`` (None: ``DEFAULT_WORKLOAD``)."""
    return f"{tier}/{workload or DEFAULT_WORKLOAD}"


def class_tier(cls: TrafficClass) -> str:
    """The tier part of a traffic class."""
    return cls.partition("/")[0]


DrafterMode = Literal["loaded", "off"]
"""A worker's drafter: loaded at start (k > 0 possible) or not (started without speculation)."""


class ClassForecast(BaseModel):
    """The forecast load of one traffic class (``controller.forecast``), as a plan records it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate_rps: Annotated[float, Field(ge=0)]
    """Expected arrival rate, requests per second."""
    upper_rps: Annotated[float, Field(ge=0)]
    """The error band's upper edge, requests per second: what the plan is sized for."""
    prompt_tokens: Annotated[float, Field(ge=0)] = 0.0
    """Mean prompt length, tokens."""
    output_tokens: Annotated[float, Field(ge=0)] = 0.0
    """Mean output length, tokens."""


class PoolPlan(BaseModel):
    """One pool: a set of workers that serve a set of traffic classes at one gear."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=_NAME)]
    classes: list[TrafficClass]
    """Traffic classes this pool serves (``"<tier>/<workload>"`` or ``"<tier>/*"``)."""
    workers: list[str]
    """Worker ids in this pool."""
    k: Annotated[int, Field(ge=0)] | None = None
    """The pool's speculation length; None lets each worker's own loop decide."""
    max_concurrency: Annotated[int, Field(gt=0)] | None = None
    """Requests the gateways together may have in flight on one worker of this pool (within the worker's
    ``max_num_seqs``); None leaves it uncapped."""
    drafter: DrafterMode = "loaded"
    """The pool's workers run with their drafter loaded, or were (re)started without it (``off``: k = 0 only)."""
    k_cap: Annotated[int, Field(ge=0)] | None = None
    """The most k the workers' own loops may choose (with ``k`` None); None: up to each worker's k_max."""
    worker_caps: dict[str, Annotated[int, Field(gt=0)]] = {}
    """Per-worker concurrency caps, overriding ``max_concurrency`` for the workers named."""
    forecast: dict[TrafficClass, ClassForecast] = {}
    """The load per class this pool was sized for."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        for i, cls in enumerate(self.classes):
            tier, sep, workload = cls.partition("/")
            if not (tier and sep and workload) or "/" in workload:
                raise ValueError(f"classes[{i}]: {cls!r} is not '<tier>/<workload>'")
        if len(set(self.workers)) != len(self.workers):
            raise ValueError(f"workers: duplicate worker id in {self.workers}")
        if unknown := sorted(set(self.worker_caps) - set(self.workers)):
            raise ValueError(f"worker_caps: {unknown} not in this pool's workers")
        if self.drafter == "off" and (self.k or 0) > 0:
            raise ValueError(f"k: {self.k} on a drafter-free pool (only k = 0 runs without a drafter)")
        if self.k is not None and self.k_cap is not None:
            raise ValueError("k_cap: set either a pool k or a k cap, not both")
        return self

    def concurrency_cap(self, worker_id: str) -> int | None:
        """The requests the gateways may have in flight on ``worker_id`` (None: uncapped)."""
        return self.worker_caps.get(worker_id, self.max_concurrency)

    def serves(self, cls: TrafficClass) -> bool:
        """Whether this pool lists ``cls``, exactly or through its tier's ``"<tier>/*"``."""
        return cls in self.classes or f"{class_tier(cls)}/{ANY_WORKLOAD}" in self.classes

    def tpot_target(self, tiers: Mapping[str, TierConfig]) -> float | None:
        """The TPOT target this pool protects, seconds: the tightest of its classes' tiers (None: none has one)."""
        targets = [t.tpot_target_s for c in self.classes if (t := tiers.get(class_tier(c))) and t.tpot_target_s]
        return min(targets) if targets else None


class FleetPlan(BaseModel):
    """The placement of one model's workers, as the controller's planner issued it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    version: Annotated[int, Field(ge=0)]
    """Grows by one each time the planner changes the pools (a republished, unchanged plan keeps it)."""
    issued_at: float
    """When the plan was (re)published, Unix seconds."""
    ttl_s: Annotated[float, Field(gt=0)]
    """Seconds after ``issued_at`` during which readers follow the plan."""
    pools: list[PoolPlan]
    spill_margin: Annotated[float, Field(ge=0, lt=1)] = 0.2
    """Batch work may spill onto an interactive worker only while that worker's predicted TPOT stays below
    ``(1 - spill_margin)`` × the interactive TPOT target."""
    reason: str = ""
    """Why the planner chose this plan, in words (``gearshift controller explain`` shows it)."""
    predicted: dict[str, float] = {}
    """The planner's predictions behind the plan (e.g. goodput tok/s, per-pool TPOT s), by name."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pools: duplicate pool name in {names}")
        seen: dict[str, str] = {}
        for i, pool in enumerate(self.pools):
            for worker in pool.workers:
                if worker in seen:
                    raise ValueError(f"pools[{i}].workers: worker {worker!r} is already in pool {seen[worker]!r}")
                seen[worker] = pool.name
        return self

    def pool_of_worker(self, worker_id: str) -> PoolPlan | None:
        """The pool ``worker_id`` belongs to, or None when the plan leaves it out."""
        return next((p for p in self.pools if worker_id in p.workers), None)

    def pools_for(self, cls: TrafficClass) -> list[PoolPlan]:
        """The pools that serve ``cls`` (exactly or through ``"<tier>/*"``), in plan order."""
        return [p for p in self.pools if p.serves(cls)]

    def spill_limit(self, pool: str) -> int | None:
        """The planner's ``spill_limit/<pool>``: the in-flight requests per worker of ``pool`` up to which its predicted
        TPOT keeps ``spill_margin`` inside its tightest target for the forecast mix (the gateway spills batch work onto
        it only below this); None when the plan has none (an older controller, a pool whose gear its loops choose)."""
        found = self.predicted.get(SPILL_LIMIT_KEY + pool)
        return None if found is None else int(found)

    def fresh(self, now: float) -> bool:
        """Whether readers should follow this plan at ``now`` (Unix s): issued at most ``ttl_s`` ago."""
        return now - self.issued_at <= self.ttl_s

    def age_s(self, now: float) -> float:
        """Seconds since the plan was issued."""
        return now - self.issued_at


async def publish_plan(store: Store, plan: FleetPlan) -> None:
    """Write ``plan`` as its model's document in ``PLANS_COLLECTION`` (kept ``STORE_TTL_FACTOR`` × its TTL), its
    default-valued fields left out (readable by older gateways when it uses none of the newer fields)."""
    body = plan.model_dump_json(exclude_defaults=True)
    await store.put_doc(PLANS_COLLECTION, plan.model, body, ttl_s=plan.ttl_s * STORE_TTL_FACTOR)


async def read_plans(store: Store) -> dict[str, FleetPlan]:
    """Every plan in the store, by model, fresh or not (``FleetPlan.fresh`` says). A document that does not
    validate is skipped with a warning naming the field."""
    plans: dict[str, FleetPlan] = {}
    for model, body in (await store.docs(PLANS_COLLECTION)).items():
        try:
            plans[model] = FleetPlan.model_validate_json(body)
        except ValidationError as exc:
            log.warning("plans/%s: ignored, not a valid plan: %s", model, exc)
    return plans
