"""Eligibility: the one rule of which workers may take a new request, used by the router's filters and by the
overload gate (``gateway.intake.overload``) alike.

A worker is *routable* at Unix time ``now`` while it serves the model, its last health probe passed (and its
connections are not being refused), it is not ejected (by this gateway or, through the store, by any replica),
and its drafter-free gear record (``fleet.worker_mode``), if any, is routable: a draining worker finishes the
requests it has and gets no new ones; a restarting one serves nothing. Workers with no mode record (no
controller, or one that never moved them) are kept. The records are re-read with the published states
(``gateway.routing.pool.WorkerPool.refresh_shared``).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.routing.context import RouteContext
from gateway.routing.pool import WorkerView


class _Eligibility:
    """A filter that keeps the workers ``keep`` accepts."""

    name: str

    @staticmethod
    def keep(worker: WorkerView, now: float) -> bool:
        raise NotImplementedError

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[WorkerView]:
        keep, now = self.keep, ctx.now
        return [w for w in workers if keep(w, now)]


class ModelFilter:
    """Keep workers that serve the requested model."""

    name = "model"

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[WorkerView]:
        return [w for w in workers if w.config.model == ctx.model]


class HealthyFilter(_Eligibility):
    """Keep workers whose last health probe passed and whose connections are not being refused."""

    name = "healthy"

    @staticmethod
    def keep(worker: WorkerView, now: float) -> bool:
        return worker.healthy


class NotEjectedFilter(_Eligibility):
    """Keep workers not ejected (by this gateway or, through the store, by any replica)."""

    name = "not-ejected"

    @staticmethod
    def keep(worker: WorkerView, now: float) -> bool:
        return worker.ejected_until <= now


class NotDrainingFilter(_Eligibility):
    """Keep workers whose mode record, if any, is routable (``serving`` or ``returning``)."""

    name = "not-draining"

    @staticmethod
    def keep(worker: WorkerView, now: float) -> bool:
        return worker.mode is None or worker.mode.routable


ELIGIBILITY: tuple[_Eligibility, ...] = (HealthyFilter(), NotEjectedFilter(), NotDrainingFilter())
"""The router's eligibility filters, in order (after ``ModelFilter``)."""


def routable(worker: WorkerView, now: float) -> bool:
    """``worker`` may take a new request of its model at Unix time ``now`` (every ``ELIGIBILITY`` filter keeps it)."""
    return all(f.keep(worker, now) for f in ELIGIBILITY)
