"""Admission: a tenant's limits as store limits, checked and reserved in one ``Store.admit`` call and
reconciled in one ``Store.settle`` call after the response.

Keys (the store adds its own prefix): ``rpm:<tenant>`` and ``tpm:<tenant>`` (rolling 60 s windows, requests
and tokens), ``concurrency:<tenant>`` (slots, one per in-flight request), ``spend:<tenant>`` (USD, all time).
The TPM window reserves the estimated tokens (prompt estimate + completion allowance) up front; ``settle``
corrects it by ``real − estimated`` so the window holds what was actually used.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.clock import Clock
from fleet.config import TenantConfig
from fleet.store import BudgetLimit, Limit, SlotLimit, Store, WindowLimit
from gateway.errors import BudgetExceeded, RateLimited

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


class Admitter:
    """Admits and settles requests against the shared store."""

    def __init__(self, store: Store, *, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def admit(self, tenant: TenantConfig, *, request_id: str, tokens: int) -> Ticket:
        """Reserve every limit of ``tenant`` or raise ``RateLimited`` / ``BudgetExceeded`` naming the limit."""
        limits, ticket = tenant_limits(tenant, request_id=request_id, tokens=tokens)
        if not limits:
            return ticket
        ticket.admitted_at = self._clock.wall()
        result = await self._store.admit(limits, now=ticket.admitted_at)
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

    async def settle(self, ticket: Ticket, *, used_tokens: int, cost_usd: float) -> None:
        """Reconcile the TPM reservation with ``used_tokens``, release the slot, add ``cost_usd``. Idempotent."""
        if ticket.settled:
            return
        ticket.settled = True
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
            await self._store.settle(windows=windows, slots=slots, spend=spend, now=self._clock.wall())
