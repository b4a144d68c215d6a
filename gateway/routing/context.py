"""What every routing plug-in sees and the signatures they share (STYLE 7, 15): a filter keeps candidates, a
scorer gives each candidate a score in [0, 1], a post-pick hook learns where the request went."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from fleet.config import SpeculationMode, TierConfig
from fleet.plan import FleetPlan, TrafficClass
from gateway.routing.pool import WorkerView


@dataclass(frozen=True, slots=True)
class RouteContext:
    model: str
    tier: TierConfig
    now: float
    """Unix seconds."""
    prompt_tokens: int = 0
    """The request's estimated prompt tokens (the prefill it adds to the worker it goes to)."""
    traffic_class: TrafficClass | None = None
    """``"<tier>/<workload>"`` (``fleet.plan.traffic_class``); None: unknown (placement keeps every worker)."""
    plan: FleetPlan | None = None
    """The latest fleet plan the gateway read for ``model``, fresh or not (``filters.placement`` checks)."""
    prefix_blocks: tuple[int, ...] = ()
    """Chained hashes of the prompt's leading blocks, computed once per request (``gateway.routing.prefix``)."""
    speculation: SpeculationMode = SpeculationMode.AUTO
    """The request's speculation mode: its ``x-gearshift-speculation`` header or its tier's
    (``gateway.routing.filters.speculation``)."""


class Filter(Protocol):
    name: str

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[WorkerView]:
        """The workers that pass: a subset of ``workers``, in their order."""
        ...


class Scorer(Protocol):
    name: str

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[float]:
        """One score in [0, 1] per worker, higher is better."""
        ...


class PostPick(Protocol):
    """Told which worker a request was sent to (the first that answered, after any retries)."""

    def picked(self, ctx: RouteContext, worker: WorkerView) -> None: ...
