"""Admission: a tenant's limits as store limits, checked and reserved in one ``Store.admit`` call and
reconciled in one ``Store.settle`` call after the response.

Keys (the store adds its own prefix): ``rpm:<tenant>`` and ``tpm:<tenant>`` (rolling 60 s windows, requests
and tokens), ``concurrency:<tenant>`` (slots, one per in-flight request), ``spend:<tenant>`` (USD, all time).
The TPM window reserves the estimated tokens (prompt estimate + completion allowance) up front; ``settle``
corrects it by ``real − estimated`` so the window holds what was actually used.

When the shared store fails (a Redis outage), ``store_failure_mode`` decides: ``closed`` refuses with 503;
``open`` (the default) keeps serving and enforces each limit × ``local_limit_share`` in a store local to this
process (with N replicas, a share of 1/N keeps the fleet-wide limit), settling those requests there too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from fleet.clock import Clock
from fleet.config import TenantConfig
from fleet.store.memory import MemoryStore
from fleet.store.protocol import Admission, BudgetLimit, Limit, SlotLimit, Store, WindowLimit
from gateway.errors import BudgetExceeded, RateLimited, StoreUnavailable
from gateway.metrics import GatewayMetrics

REASONS = ("rpm", "tpm", "concurrency", "budget")
"""Every admission-rejection reason (a bounded metric label)."""


@dataclass(slots=True)
class Ticket:
    """What one admitted request holds; ``settle`` returns it."""

    tenant: str
    reserved_tokens: int
    tpm: WindowLimit | None
    slot: SlotLimit | None
    budget_key: str | None
    admitted_at: float = 0.0
    """Unix seconds of the admit call (the store needs it to refund the right part of a window)."""
    local: bool = False
    """Admitted by the process-local fallback store during a store outage."""
    settled: bool = False


def tenant_limits(tenant: TenantConfig, *, request_id: str, tokens: int) -> tuple[list[Limit], Ticket]:
    """The limits of one request by ``tenant`` reserving ``tokens`` (estimated) against its TPM."""
    limits: list[Limit] = []
    if tenant.rpm is not None:
        limits.append(WindowLimit(key=f"rpm:{tenant.id}", cost=1, limit=tenant.rpm))
    tpm = WindowLimit(key=f"tpm:{tenant.id}", cost=tokens, limit=tenant.tpm) if tenant.tpm is not None else None
    if tpm is not None:
        limits.append(tpm)
    slot = None
    if tenant.max_concurrency is not None:
        slot = SlotLimit(key=f"concurrency:{tenant.id}", slot_id=request_id, limit=tenant.max_concurrency)
        limits.append(slot)
    budget_key = f"spend:{tenant.id}"
    if tenant.budget_usd is not None:
        limits.append(BudgetLimit(key=budget_key, limit_usd=tenant.budget_usd))
    return limits, Ticket(tenant=tenant.id, reserved_tokens=tokens, tpm=tpm, slot=slot, budget_key=budget_key)


_REASON_OF_PREFIX = {"rpm": "rpm", "tpm": "tpm", "concurrency": "concurrency", "spend": "budget"}


def reason_of(key: str) -> str:
    """The rejection reason of a tripped limit key (``rpm:acme`` → ``rpm``, ``spend:acme`` → ``budget``)."""
    return _REASON_OF_PREFIX.get(key.split(":", 1)[0], "rpm")


def _scaled(limit: Limit, share: float) -> Limit:
    if isinstance(limit, BudgetLimit):
        return replace(limit, limit_usd=limit.limit_usd * share)
    return replace(limit, limit=max(1, int(limit.limit * share)))


def _constant(value: float) -> Callable[[], float]:
    return lambda: value


class Admitter:
    """Admits and settles requests against the shared store (or, in an outage, the local fallback)."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock,
        metrics: GatewayMetrics,
        failure_mode: Literal["open", "closed"] = "open",
        local_share: float | Callable[[], float] = 1.0,
    ) -> None:
        self._store = store
        self._clock = clock
        self._metrics = metrics
        self._failure_mode = failure_mode
        self._local_share = local_share if callable(local_share) else _constant(local_share)
        """The share of each limit enforced here during an outage (``gateway.replicas``: 1 / replicas)."""
        self._local = MemoryStore(clock=clock)

    async def admit(self, tenant: TenantConfig, *, request_id: str, tokens: int) -> Ticket:
        """Reserve every limit of ``tenant`` or raise ``RateLimited`` / ``BudgetExceeded`` naming the limit."""
        limits, ticket = tenant_limits(tenant, request_id=request_id, tokens=tokens)
        if not limits:
            return ticket
        ticket.admitted_at = self._clock.wall()
        result = await self._admit(limits, ticket)
        if result.allowed:
            return ticket
        reason = reason_of(result.tripped or "")
        if reason == "budget":
            raise BudgetExceeded(
                f"Tenant '{tenant.id}' has spent its budget of {tenant.budget_usd} USD.",
                limit=reason,
                retry_after_s=result.retry_after_s or 3600.0,
            )
        raise RateLimited(
            f"Tenant '{tenant.id}' exceeded its {reason} limit; retry after {result.retry_after_s:.1f} s.",
            limit=reason,
            retry_after_s=result.retry_after_s,
        )

    async def _admit(self, limits: list[Limit], ticket: Ticket) -> Admission:
        try:
            return await self._store.admit(limits, now=ticket.admitted_at)
        except Exception as exc:  # the shared store is away: apply the configured failure mode
            self._metrics.child(self._metrics.store_failures, "admit").inc()
            if self._failure_mode == "closed":
                raise StoreUnavailable(f"Admission is unavailable: the shared store failed ({exc!r}).") from None
        ticket.local = True
        share = self._local_share()
        if ticket.tpm is not None:
            ticket.tpm = replace(ticket.tpm, limit=max(1, int(ticket.tpm.limit * share)))
        local = [_scaled(limit, share) for limit in limits]
        return await self._local.admit(local, now=ticket.admitted_at)

    async def settle(self, ticket: Ticket, *, used_tokens: int, cost_usd: float) -> None:
        """Reconcile the TPM reservation with ``used_tokens``, release the slot, add ``cost_usd``. Idempotent
        once it succeeds (a failed settle can be retried)."""
        if ticket.settled:
            return
        windows = []
        if ticket.tpm is not None and used_tokens != ticket.reserved_tokens:
            windows.append(
                WindowLimit(
                    key=ticket.tpm.key,
                    cost=used_tokens - ticket.reserved_tokens,
                    limit=ticket.tpm.limit,
                    reserved_at=ticket.admitted_at,
                )
            )
        slots = [ticket.slot] if ticket.slot is not None else []
        spend = {ticket.budget_key: cost_usd} if ticket.budget_key and cost_usd > 0 else {}
        if windows or slots or spend:
            store = self._local if ticket.local else self._store
            try:
                await store.settle(windows=windows, slots=slots, spend=spend, now=self._clock.wall())
            except Exception:
                self._metrics.child(self._metrics.store_failures, "settle").inc()
                raise
        ticket.settled = True
