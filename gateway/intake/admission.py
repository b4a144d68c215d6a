"""Admission: a tenant's limits as store limits, checked and reserved in one ``Store.admit`` call and
reconciled in one ``Store.settle`` after the response (batched with others, ``Store.settle_many``).

Keys (the store adds its own prefix): ``rpm:<tenant>`` and ``tpm:<tenant>`` (rolling 60 s windows, requests
and tokens), ``concurrency:<tenant>`` (slots, one per in-flight request), ``spend:<tenant>`` (USD, all time, added by
the ledger with each usage record, so spend is billed exactly once, with the record) or, for a tenant whose budget
has a period, the counter of the period holding the admission's ``now`` (``fleet.budget_period``: a new period is a
new counter, so neither the store's spend nor a lease's view of it crosses a reset).
The TPM window reserves the estimated tokens (prompt estimate + completion allowance) up front; ``settle``
corrects it by ``real − estimated`` so the window holds what was actually used.

When the shared store fails (a Redis outage), ``store_failure_mode`` decides: ``closed`` refuses with 503;
``open`` (the default) keeps serving and enforces each limit × ``local_limit_share`` in a store local to this
process (with N replicas, a share of 1/N keeps the fleet-wide limit), settling those requests there too (their
spend counts locally until their usage records reach the store). A budget is not started afresh: every answer
from the store carries the tenant's spend (``Admission.spent_usd``), and during the outage this replica may spend
its share of what was left of the budget at the last spend it saw; a budgeted tenant whose spend it never saw is
refused with 503 (docs/operations/outages.md states the bound per limit).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from fleet.budget_period import billed_counters, budget_key, counter_series, is_spend_key, period_span
from fleet.clock import Clock
from fleet.config import TenantConfig
from fleet.store.keys import scope_of, spend_key
from fleet.store.memory import MemoryStore, in_process
from fleet.store.protocol import Admission, BudgetLimit, Limit, Settlement, SlotLimit, Store, UsageRecord, WindowLimit
from gateway.errors import BudgetExceeded, RateLimited, StoreUnavailable
from gateway.intake.admit_batch import AdmitBatcher
from gateway.intake.leases import LeaseBook, LeasePolicy
from gateway.intake.replicas import ReplicaRegistry
from gateway.settings import GatewaySettings
from gateway.upstream.deadline import Deadline
from gateway.usage.metrics import GatewayMetrics

_NO_DEADLINE = contextlib.nullcontext()


@dataclass(slots=True)
class Ticket:
    """What one admitted request holds; ``settle`` returns it."""

    tenant: str
    request_id: str
    reserved_tokens: int
    tpm: WindowLimit | None
    slot: SlotLimit | None
    budget_key: str | None
    """The spend counter the request's budget was checked against (its period's, ``fleet.budget_period``)."""
    admitted_at: float = 0.0
    """Unix seconds of the admit call (the store needs it to refund the right part of a window)."""
    granted_at: float | None = None
    """Unix seconds when the admit call returned admitted (None for a tenant without limits)."""
    local: bool = False
    """Admitted by the process-local fallback store during a store outage."""
    leased_tpm: WindowLimit | None = None
    """The TPM reservation drawn from this replica's lease (``gateway.intake.leases``): corrected there, not in the
    store."""
    settled: bool = False


def tenant_limits(
    tenant: TenantConfig, *, request_id: str, tokens: int, slot_ttl_s: float = 600.0, now: float = 0.0
) -> tuple[list[Limit], Ticket]:
    """The limits of one request by ``tenant`` reserving ``tokens`` (estimated) against its TPM; its concurrency slot
    expires after ``slot_ttl_s`` unless released (``GatewaySettings.slot_ttl_s``); its budget is checked against the
    spend counter of the budget period holding ``now`` (Unix s)."""
    limits: list[Limit] = []
    if tenant.rpm is not None:
        limits.append(WindowLimit(key=f"rpm:{tenant.id}", cost=1, limit=tenant.rpm))
    tpm = WindowLimit(key=f"tpm:{tenant.id}", cost=tokens, limit=tenant.tpm) if tenant.tpm is not None else None
    if tpm is not None:
        limits.append(tpm)
    slot = None
    if tenant.max_concurrency is not None:
        slot = SlotLimit(
            key=f"concurrency:{tenant.id}", slot_id=request_id, limit=tenant.max_concurrency, ttl_s=slot_ttl_s
        )
        limits.append(slot)
    budget_key = spend_key(tenant.id) if tenant.budget_usd is None else budget_key_of(tenant, now)
    if tenant.budget_usd is not None:
        limits.append(BudgetLimit(key=budget_key, limit_usd=tenant.budget_usd))
    ticket = Ticket(
        tenant=tenant.id, request_id=request_id, reserved_tokens=tokens, tpm=tpm, slot=slot, budget_key=budget_key
    )
    return limits, ticket


def budget_key_of(tenant: TenantConfig, now: float) -> str:
    """The spend counter ``tenant``'s budget is checked against at ``now`` (Unix s)."""
    return budget_key(tenant.id, tenant.budget_period, now)


_REASON_OF_PREFIX = {"rpm": "rpm", "tpm": "tpm", "concurrency": "concurrency", "spend": "budget"}


def reason_of(key: str) -> str:
    """The rejection reason of a tripped limit key (``rpm:acme`` → ``rpm``, ``spend:acme`` or a period's
    ``spend.daily.20261202:acme`` → ``budget``)."""
    return "budget" if is_spend_key(key) else _REASON_OF_PREFIX.get(key.split(":", 1)[0], "rpm")


def _unbilled_key(limit_key: str) -> str:
    """Where a replica counts a tenant's finished, not yet billed spend: one account per tenant whatever the period
    (after a reset, spend finished in the old period still counts until it lands: conservative, never over)."""
    return spend_key(scope_of(limit_key))


def _scaled(limit: Limit, share: float) -> Limit:
    if isinstance(limit, BudgetLimit):
        return replace(limit, limit_usd=limit.limit_usd * share)
    return replace(limit, limit=max(1, int(limit.limit * share)))


def _constant(value: float) -> Callable[[], float]:
    return lambda: value


class Admitter:
    """Admits and settles requests against the shared store (or, in an outage, the local fallback).

    **Local accounting until the store lands.** A finished request's slot counts as free on this replica at once
    (``finish``), and its cost as spent: the next ``admit`` of the same tenant frees those slots in the store
    first (``SlotLimit.releasing``) and counts that cost (``BudgetLimit.pending_usd``), so a sequential client at
    its concurrency limit whose next request reaches this replica is never refused for its own finished request.
    The settlement itself goes to the store after the response (``gateway.usage.metering.LedgerWriter``). Another
    replica sees the slot held until that settlement lands; a concurrency refusal is therefore retried once after
    ``concurrency_grace_s``, so across replicas a client is refused for its own finished request only when the
    settlement took longer than the grace to land after the response ended.

    **Releases ride on admits.** Each finished slot is carried, once, by the tenant's next admit that asks the store
    (``SlotLimit.releasing``: freed before the check, refused or not), so a busy tenant's slot releases cost no
    command of their own; the settlement writer, which waits ``settle_linger_s`` before it writes, drops the slots
    that have landed that way by then (``unsettled``) and writes only what is left."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock,
        metrics: GatewayMetrics,
        failure_mode: Literal["open", "closed"] = "open",
        local_share: float | Callable[[], float] = 1.0,
        concurrency_grace_s: float = 0.0,
        slot_ttl_s: float = 600.0,
        leases: LeaseBook | None = None,
        batch: bool = False,
        store_timeout_s: float = 2.0,
    ) -> None:
        self._store = store
        self._store_timeout_s: float | None = None if in_process(store) else store_timeout_s
        """The deadline of one admit call to the store (``GatewaySettings.store_timeout_s``); None for the in-process
        store, whose admit is a function call that cannot hang."""
        self._ask = AdmitBatcher(store).admit if batch else store.admit
        """The store's admit, batched per event-loop tick with ``batch`` (``gateway.intake.admit_batch``)."""
        self.leases = leases
        """Quota leases for the windows and budgets (None: every request asks the store)."""
        self._spend_views = leases if leases is not None and leases.enabled else None
        """The lease book when it leases anything: its views of the store's spend matter only then."""
        self._clock = clock
        self._metrics = metrics
        self._failure_mode = failure_mode
        self._local_share = local_share if callable(local_share) else _constant(local_share)
        """The share of each limit enforced here during an outage (``gateway.intake.replicas``: 1 / replicas)."""
        self._grace_s = concurrency_grace_s
        self._slot_ttl_s = slot_ttl_s
        self._local = MemoryStore(clock=clock)
        self._releasing: dict[str, set[str]] = {}
        """Concurrency key → slot ids of finished requests whose settlement has not reached the store yet."""
        self._uncarried: dict[str, dict[str, None]] = {}
        """Concurrency key → the finished slot ids of ``_releasing`` that no admit has carried to the store yet."""
        self._unbilled: dict[str, float] = {}
        """Spend key → USD of finished requests whose usage record is not in the store yet."""
        self._known_spend: dict[str, float] = {}
        """Spend key → the spend counter (USD) the store last reported for it: the budget's base in an outage."""
        self._latest_period: dict[str, str] = {}
        """Counter series (``fleet.budget_period.counter_series``) → its latest period's key in ``_known_spend``."""

    @classmethod
    def from_settings(
        cls,
        store: Store,
        *,
        clock: Clock,
        metrics: GatewayMetrics,
        settings: GatewaySettings,
        replicas: ReplicaRegistry,
    ) -> Admitter:
        """The admitter of ``settings``, enforcing ``replicas``' local share of each limit during an outage."""
        local = in_process(store)  # no round trip to save: no leases, no batching
        policy = LeasePolicy(fraction=0.0) if local else LeasePolicy.from_settings(settings)
        leases = LeaseBook(store, clock, share=replicas.share, policy=policy,
                           on_error=lambda op: metrics.child(metrics.store_failures, op).inc())  # fmt: skip
        return cls(store, clock=clock, metrics=metrics, failure_mode=settings.store_failure_mode,
                   local_share=replicas.share, concurrency_grace_s=settings.concurrency_grace_s,
                   slot_ttl_s=settings.slot_ttl_s(),
                   leases=leases, batch=not local, store_timeout_s=settings.store_timeout_s)  # fmt: skip

    async def admit(
        self, tenant: TenantConfig, *, request_id: str, tokens: int, deadline: Deadline | None = None
    ) -> Ticket:
        """Reserve every limit of ``tenant`` or raise ``RateLimited`` / ``BudgetExceeded`` naming the limit.
        ``deadline``: the call's (``gateway.upstream.deadline``), whose one timer then also bounds its store calls."""
        now = self._clock.wall()
        limits, ticket = tenant_limits(
            tenant, request_id=request_id, tokens=tokens, slot_ttl_s=self._slot_ttl_s, now=now
        )
        if not limits:
            return ticket
        ticket.admitted_at = now
        limits, drawn = self._draw_leases(limits, ticket)
        if not limits:  # every limit passed here, under a lease
            ticket.granted_at = ticket.admitted_at
            return ticket
        result = await self._admit(limits, ticket, release=False, deadline=deadline)
        slot_key = ticket.slot.key if ticket.slot is not None else None
        if not result.allowed and result.tripped == slot_key and slot_key in self._releasing:
            result = await self._admit(limits, ticket, release=True, deadline=deadline)  # free this replica's slots
        if not result.allowed and result.tripped == slot_key and self._grace_s > 0:
            await self._clock.sleep(self._grace_s)  # another replica's settlement of a finished request may land
            ticket.admitted_at = self._clock.wall()
            result = await self._admit(limits, ticket, release=True, deadline=deadline)
        if result.allowed:
            ticket.granted_at = self._clock.wall()
            return ticket
        self._undraw(drawn, ticket)
        reason = reason_of(result.tripped or "")
        if reason == "budget":
            span = period_span(tenant.budget_period, ticket.admitted_at)
            per = f" {tenant.budget_period}" if span.resets else ""
            raise BudgetExceeded(
                f"Tenant '{tenant.id}' has spent its{per} budget of {tenant.budget_usd} USD.",
                limit=reason,
                retry_after_s=span.end - ticket.admitted_at if span.resets else (result.retry_after_s or 3600.0),
            )
        raise RateLimited(
            f"Tenant '{tenant.id}' exceeded its {reason} limit; retry after {result.retry_after_s:.1f} s.",
            limit=reason,
            retry_after_s=result.retry_after_s,
        )

    async def _admit(
        self, limits: list[Limit], ticket: Ticket, *, release: bool, deadline: Deadline | None = None
    ) -> Admission:
        """One admit call. It carries the finished slots no admit has carried yet; with ``release`` (after a
        concurrency refusal), every slot of this replica's finished requests whose release has not landed."""
        limits = [self._with_local_accounting(limit, release=release) for limit in limits]
        waits = Deadline() if deadline is None else deadline
        try:  # a hung store fails like a refusing one (the in-process store's admit is a call: no deadline)
            with _NO_DEADLINE if self._store_timeout_s is None else waits.after(self._store_timeout_s):
                result = await self._ask_store(limits, now=ticket.admitted_at)
        except Exception as exc:  # the shared store is away: apply the configured failure mode
            self._metrics.child(self._metrics.store_failures, "admit").inc()
            if self._failure_mode == "closed":
                raise StoreUnavailable(f"Admission is unavailable: the shared store failed ({exc!r}).") from None
        else:
            for limit in limits:  # the store has freed them
                if isinstance(limit, SlotLimit):
                    self._released(limit.key, limit.releasing)
            if result.spent_usd is not None and ticket.budget_key is not None:
                self._remember_spend(ticket.budget_key, result.spent_usd)
            return result
        finally:
            if deadline is None:
                waits.close()
        ticket.local = True
        share = self._local_share()
        local = [self._local_budget(limit, share) if isinstance(limit, BudgetLimit) else _scaled(limit, share)
                 for limit in limits]  # fmt: skip
        ticket.tpm = next(
            (w for w in local if isinstance(w, WindowLimit) and ticket.tpm and w.key == ticket.tpm.key), None
        )
        return await self._local.admit(local, now=ticket.admitted_at)

    def _local_budget(self, limit: BudgetLimit, share: float) -> BudgetLimit:
        """A budget during an outage: the last spend the store reported plus this replica's unbilled spend, against
        that spend plus ``share`` of what was left (the local store's own counter stays 0). A budget period that
        began since the replica last heard the store starts at 0 (no record it saw is in it). 503 when this replica
        never saw the tenant's spend: it cannot know what is left."""
        known = self._known_spend.get(limit.key)
        if known is None and counter_series(limit.key) in self._latest_period:
            known = 0.0  # a period that began after this replica last heard the store: no record it saw is in it
        if known is None:
            raise StoreUnavailable(
                "The shared store is away and this gateway has not seen the tenant's spend yet: the budget cannot be "
                "checked."
            )
        left = max(0.0, limit.limit_usd - known)
        return replace(limit, limit_usd=known + share * left, pending_usd=known + limit.pending_usd)

    def _remember_spend(self, key: str, spent_usd: float) -> None:
        """The store reported ``spent_usd`` on the counter ``key``; an earlier period's counter is forgotten."""
        series = counter_series(key)
        earlier = self._latest_period.get(series)
        if earlier is not None and earlier != key:
            self._known_spend.pop(earlier, None)
        self._latest_period[series] = key
        self._known_spend[key] = spent_usd

    async def _ask_store(self, limits: list[Limit], *, now: float) -> Admission:
        result = await self._ask(limits, now=now)
        if result.spent_usd is not None and self._spend_views is not None:  # a fresh budget lease
            budget = next((lim for lim in limits if isinstance(lim, BudgetLimit)), None)
            if budget is not None:
                self._spend_views.saw_spend(budget.key, result.spent_usd)
        return result

    def _draw_leases(self, limits: list[Limit], ticket: Ticket) -> tuple[list[Limit], list[WindowLimit]]:
        """The limits left for the store once this replica's leases have covered what they can, and the window
        draws made (given back if the store then refuses the request)."""
        leases = self.leases
        if leases is None or not leases.enabled:
            return limits, []
        rest: list[Limit] = []
        drawn: list[WindowLimit] = []
        for limit in limits:
            if isinstance(limit, WindowLimit) and leases.take(limit):
                drawn.append(limit)
                if ticket.tpm is not None and limit.key == ticket.tpm.key:
                    ticket.leased_tpm, ticket.tpm = ticket.tpm, None
            elif (
                isinstance(limit, BudgetLimit)
                and not rest
                and leases.budget_covered(replace(limit, pending_usd=self._unbilled.get(_unbilled_key(limit.key), 0.0)))
            ):
                pass  # when the request asks the store anyway (``rest``: the budget comes last), the budget rides
                # along: checked exactly, and the answer refreshes the lease's spend (no read of its own)
            else:
                rest.append(limit)
        return rest, drawn

    def _undraw(self, drawn: list[WindowLimit], ticket: Ticket) -> None:
        if self.leases is not None:
            for limit in drawn:
                self.leases.give_back(limit)
        if ticket.leased_tpm is not None:
            ticket.tpm, ticket.leased_tpm = ticket.leased_tpm, None

    async def close(self) -> None:
        """End this replica's leases, returning their unused parts to the store."""
        if self.leases is not None:
            await self.leases.close()

    def _with_local_accounting(self, limit: Limit, *, release: bool) -> Limit:
        if isinstance(limit, SlotLimit):
            if release and self._releasing.get(limit.key):  # every finished slot not known freed
                return replace(limit, releasing=tuple(self._releasing[limit.key]))
            carried = self._uncarried.pop(limit.key, None)  # each finished slot rides on one admit
            return replace(limit, releasing=tuple(carried)) if carried else limit
        if isinstance(limit, BudgetLimit) and _unbilled_key(limit.key) in self._unbilled:
            return replace(limit, pending_usd=self._unbilled[_unbilled_key(limit.key)])
        return limit

    async def finish(self, ticket: Ticket, *, used_tokens: int, cost_usd: float) -> Settlement | None:
        """The request is over: its slot is free and its ``cost_usd`` spent as far as this replica's admissions go,
        at once. Returns the settlement for the shared store (reconcile the TPM reservation with ``used_tokens``,
        release the slot), to apply after the response (``settle_landed`` once it has); None when there is
        nothing to send (a fallback ticket settles locally here). Idempotent: a second call returns None."""
        if ticket.settled:
            return None
        ticket.settled = True
        if ticket.budget_key and cost_usd > 0:
            key = _unbilled_key(ticket.budget_key)
            self._unbilled[key] = self._unbilled.get(key, 0.0) + cost_usd
        windows: tuple[WindowLimit, ...] = ()
        if ticket.leased_tpm is not None and self.leases is not None:
            self.leases.adjust(ticket.leased_tpm.key, ticket.reserved_tokens - used_tokens)
        if ticket.tpm is not None and used_tokens != ticket.reserved_tokens:
            correction = used_tokens - ticket.reserved_tokens
            windows = (replace(ticket.tpm, cost=correction, reserved_at=ticket.admitted_at),)
        slots = (ticket.slot,) if ticket.slot is not None else ()
        if not (windows or slots):
            return None
        settlement = Settlement(settle_id=ticket.request_id, windows=windows, slots=slots)
        if ticket.local:
            await self._local.settle_many([settlement], now=self._clock.wall())
            return None
        if ticket.slot is not None:
            self._releasing.setdefault(ticket.slot.key, set()).add(ticket.slot.slot_id)
            self._uncarried.setdefault(ticket.slot.key, {})[ticket.slot.slot_id] = None
        return settlement

    def unsettled(self, settlements: Sequence[Settlement]) -> list[Settlement]:
        """What of ``settlements`` the store still needs, just before they are written: the slots an admit has freed
        meanwhile dropped (an admit that failed left its slots in ``_releasing``: they are written here), and the
        settlements left with nothing dropped. The slots kept are written here, so no admit carries them too."""
        needed = []
        for s in settlements:
            slots = tuple(slot for slot in s.slots if slot.slot_id in self._releasing.get(slot.key, ()))
            for slot in slots:
                self._not_carried(slot.key, slot.slot_id)
            if len(slots) != len(s.slots):
                s = replace(s, slots=slots)
            if s.windows or s.slots or s.spend:
                needed.append(s)
        return needed

    def _not_carried(self, key: str, slot_id: str) -> None:
        carried = self._uncarried.get(key)
        if carried is not None:
            carried.pop(slot_id, None)
            if not carried:
                del self._uncarried[key]

    def settle_landed(self, settlements: Sequence[Settlement]) -> None:
        """The store has applied ``settlements``: their slots need no local accounting any more."""
        for s in settlements:
            for slot in s.slots:
                self._released(slot.key, (slot.slot_id,))

    def _released(self, key: str, slot_ids: Sequence[str]) -> None:
        held = self._releasing.get(key)
        if held is not None:
            held.difference_update(slot_ids)
            if not held:
                del self._releasing[key]

    def usage_landed(self, records: Sequence[UsageRecord]) -> None:
        """The store's ledger has ``records`` (and their spend): stop counting their cost locally."""
        for r in records:
            key = spend_key(r.tenant)
            if self._spend_views is not None:  # the store's counters now hold it: so do the lease's views of them
                for counter in billed_counters(r.tenant, r.at):
                    self._spend_views.landed_spend(counter.key, r.cost_usd)
            left = self._unbilled.get(key, 0.0) - r.cost_usd
            if left > 1e-12:
                self._unbilled[key] = left
            else:
                self._unbilled.pop(key, None)
