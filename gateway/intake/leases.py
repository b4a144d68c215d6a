"""Quota leases: this replica's slice of a tenant's rolling-window limits (RPM, TPM), so that a request under a lease
needs no store round trip to pass them.

A lease of ``size`` units is reserved in the store with one ordinary ``admit`` (one Lua call: the window counts the
whole slice from the grant on), served from here, refilled in the background once less than ``refill_at`` (half) of it
is left (one lease ahead at most, with ``max_outstanding`` 2), and ended ``ttl_s`` after its grant: the unused part (or
the debt of TPM corrections past it) goes back with one ``settle`` whose ``reserved_at`` is the grant, so the refund
lowers that reservation's part of the window only.

**The bound.** The store counts a leased unit at its grant; the request that draws it comes later, at most the life of
the lease. So in any 60 s window the fleet admits at most the limit plus the units outstanding in leases at the window's
start: per replica one lease and one refilled ahead, ``max_outstanding × size``. ``size`` is ``fraction × limit ×
share`` (``share``: 1 / the replicas alive, ``gateway.intake.replicas``), so the fleet's bound is ``max_outstanding ×
fraction`` of the limit; with the defaults (0.005, 2) that is 1 %. The policy is ``GatewaySettings``'
``lease_fraction``, ``lease_refill_at``, ``lease_max_outstanding`` and ``lease_ttl_s``. A limit whose slice would be
under 2 units is not leased: each request asks the store, exactly as without leases (the bound there is 0); so does a
request costing more than half a slice (a TPM reservation larger than a small limit's slice).

Near the limit a refill is refused (the window has no room for a whole slice): requests then ask the store one by one,
exact again, until the window has room.

**Budgets** are not windows and cost is known only after the response. A budget lease is the spend counter the store
last reported (every store answer carries it; a background refresh asks for it when no request did), valid for
``ttl_s``: a request passes here while that spend plus this replica's own unbilled spend stays under the limit less a
headroom of ``max_outstanding × fraction × share`` of it. Other replicas' spend since the last refresh is not seen: the
fleet overshoots only when the other replicas spend more than the headroom within one ``ttl_s``: by what they
billed in that ``ttl_s`` less the headroom (not capped by it), on top of the in-flight requests' cost that any
non-reserving budget check lets through (the bound ``docs/operations/outages.md`` states and ``gearshift bench
chaos`` checks).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from fleet.clock import Clock
from fleet.store.protocol import Admission, AdmitsRiding, BudgetLimit, Limit, Settlement, Store, WindowLimit
from gateway.settings import GatewaySettings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LeasePolicy:
    """How big a lease is, when the next one is asked for, how many are held, and how long each lives
    (``GatewaySettings.lease_*``). The fleet's over-admission of a window is at most
    ``max_outstanding × fraction`` of the limit."""

    fraction: float = 0.005
    """A lease's share of the limit (times the replica's share of the fleet); 0 turns leases off."""
    ttl_s: float = 2.0
    """A lease ends this long after its grant, its unused part returned."""
    refill_at: float = 0.5
    """The next lease is asked for once less than this share of the current one is left (refill ahead)."""
    max_outstanding: int = 2
    """Leases of one limit held at once by a replica: the one served from and, with 2, one granted ahead."""

    def __post_init__(self) -> None:
        if not 0 <= self.refill_at <= 1:
            raise ValueError(f"refill_at: {self.refill_at} is not within 0…1")
        if self.max_outstanding not in (1, 2):
            raise ValueError(f"max_outstanding: {self.max_outstanding}, expected 1 or 2")

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> LeasePolicy:
        s = settings
        return cls(fraction=s.lease_fraction, ttl_s=s.lease_ttl_s, refill_at=s.lease_refill_at,
                   max_outstanding=s.lease_max_outstanding)  # fmt: skip

    def size(self, limit: int, share: float) -> int:
        """Units per lease of a ``limit``; 0 when the slice would be under 2 (the limit is not leased)."""
        units = int(limit * self.fraction * share)
        return units if units >= 2 else 0

    def headroom(self, limit_usd: float, share: float) -> float:
        """USD of a budget left unserved from here (other replicas' spend between refreshes)."""
        return self.max_outstanding * self.fraction * share * limit_usd


@dataclass(slots=True)
class _Lease:
    left: int
    granted_at: float
    """Unix s of the admit that reserved it (its refund's ``reserved_at``)."""


@dataclass(slots=True)
class _Window:
    limit: int
    size: int
    window_s: float
    current: _Lease | None = None
    ahead: _Lease | None = None
    refilling: bool = False
    debt: int = 0
    """TPM corrections that arrived while no lease was held: settled with the next return."""


@dataclass(slots=True)
class _Spend:
    spent: float
    at: float
    refreshing: bool = False


@dataclass
class LeaseBook:
    """This replica's leases, per limit key. ``take`` and ``give_back`` are synchronous (the hot path); refills and
    returns run as background tasks on the store."""

    store: Store
    clock: Clock
    share: Callable[[], float]
    policy: LeasePolicy = field(default_factory=LeasePolicy)
    on_error: Callable[[str], None] = lambda op: None
    _windows: dict[str, _Window] = field(default_factory=dict)
    _spend: dict[str, _Spend] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def enabled(self) -> bool:
        return self.policy.fraction > 0

    # windows -------------------------------------------------------------------------------------------
    def take(self, limit: WindowLimit) -> bool:
        """Draw ``limit.cost`` units from this replica's lease of ``limit.key``: True when a lease covered them (the
        store need not be asked); False when the caller must ask the store (a refill is then under way)."""
        w = self._window(limit)
        if w.size < limit.cost * 2:  # not leased, or a slice would not cover two such requests: ask the store
            return False
        now = self.clock.wall()
        self._rotate(limit.key, w, now)
        lease = w.current
        if lease is None or lease.left < limit.cost:
            if lease is not None and w.ahead is not None:  # the rest of this lease stays until it ends
                self._end(limit.key, w, lease)
                w.current, w.ahead = w.ahead, None
                lease = w.current
            if lease is None or lease.left < limit.cost:
                self._refill(limit.key, w)
                return False
        lease.left -= limit.cost
        policy = self.policy
        if policy.max_outstanding > 1 and w.ahead is None and lease.left < w.size * policy.refill_at:
            self._refill(limit.key, w)
        return True

    def give_back(self, limit: WindowLimit) -> None:
        """Undo a ``take`` of ``limit`` (another limit of the same request refused it)."""
        self.adjust(limit.key, limit.cost)

    def adjust(self, key: str, units: int) -> None:
        """Credit ``units`` (negative: debit) to the lease of ``key``: a TPM reservation corrected by the real use."""
        w = self._windows.get(key)
        if w is None:
            return
        if w.current is not None:
            w.current.left += units
        else:
            w.debt -= units

    def _window(self, limit: WindowLimit) -> _Window:
        w = self._windows.get(limit.key)
        if w is None or w.limit != limit.limit:
            if w is not None:  # the limit changed: end the old leases
                self._end_all(limit.key, w)
            w = _Window(limit=limit.limit, size=self.policy.size(limit.limit, self.share()), window_s=limit.window_s)
            self._windows[limit.key] = w
        return w

    def _rotate(self, key: str, w: _Window, now: float) -> None:
        if w.current is not None and now - w.current.granted_at >= self.policy.ttl_s:
            self._end(key, w, w.current)
            w.current, w.ahead = w.ahead, None
        if w.current is not None and now - w.current.granted_at >= self.policy.ttl_s:
            self._end(key, w, w.current)
            w.current = None

    def _refill(self, key: str, w: _Window) -> None:
        if w.refilling:
            return
        w.refilling = True
        self._spawn(self._grant(key, w))

    async def _grant(self, key: str, w: _Window) -> None:
        try:
            now = self.clock.wall()
            result = await self._admit_soon(
                [WindowLimit(key=key, cost=w.size, limit=w.limit, window_s=w.window_s)], now=now
            )
        except Exception:  # the store is away: requests ask it (and meet the failure mode) one by one
            self.on_error("lease")
            return
        finally:
            w.refilling = False
        if not result.allowed or self._windows.get(key) is not w:
            if result.allowed:  # the limit changed while granting: return it whole
                self._return(key, w, _Lease(left=w.size, granted_at=now))
            return
        lease = _Lease(left=w.size, granted_at=now)
        if w.current is None:
            w.current = lease
            if w.debt:
                lease.left -= w.debt
                w.debt = 0
        elif w.ahead is None and self.policy.max_outstanding > 1:
            w.ahead = lease
        else:
            self._return(key, w, lease)

    def _end(self, key: str, w: _Window, lease: _Lease) -> None:
        self._return(key, w, lease)

    def _end_all(self, key: str, w: _Window) -> None:
        for lease in (w.current, w.ahead):
            if lease is not None:
                self._return(key, w, lease)
        w.current = w.ahead = None

    def _return(self, key: str, w: _Window, lease: _Lease) -> None:
        if lease.left == 0:
            return
        window = WindowLimit(
            key=key, cost=-lease.left, limit=w.limit, window_s=w.window_s, reserved_at=lease.granted_at
        )
        lease.left = 0
        self._spawn(self._settle(Settlement(settle_id=f"lease-{uuid.uuid4().hex}", windows=(window,))))

    async def _settle(self, settlement: Settlement) -> None:
        try:
            await self.store.settle_many([settlement], now=self.clock.wall())
        except Exception:  # the reservation leaves the window by itself within window_s
            self.on_error("lease-return")

    # budgets -------------------------------------------------------------------------------------------
    def saw_spend(self, key: str, spent_usd: float) -> None:
        """The store reported ``key``'s spend counter (any answer that checked the budget)."""
        entry = self._spend.get(key)
        if entry is None:
            self._spend[key] = _Spend(spent=spent_usd, at=self.clock.wall())
        else:
            entry.spent, entry.at = spent_usd, self.clock.wall()

    def landed_spend(self, key: str, usd: float) -> None:
        """This replica's usage record of ``usd`` reached the store's counter ``key``: count it in the last spend
        seen (it leaves the caller's unbilled spend at the same moment)."""
        entry = self._spend.get(key)
        if entry is not None:
            entry.spent += usd

    def budget_covered(self, limit: BudgetLimit) -> bool:
        """True when the last reported spend, still fresh, plus ``limit.pending_usd`` leaves room under the limit less
        the headroom; a refresh is started when the spend is half way to stale or missing."""
        if not self.enabled:
            return False
        entry = self._spend.get(limit.key)
        now = self.clock.wall()
        if entry is None or now - entry.at >= self.policy.ttl_s / 2:
            self._refresh_spend(limit)
        if entry is None or now - entry.at >= self.policy.ttl_s:
            return False
        room = limit.limit_usd - self.policy.headroom(limit.limit_usd, self.share())
        return entry.spent + limit.pending_usd < room

    def _refresh_spend(self, limit: BudgetLimit) -> None:
        entry = self._spend.setdefault(limit.key, _Spend(spent=0.0, at=float("-inf")))
        if entry.refreshing:
            return
        entry.refreshing = True
        self._spawn(self._read_spend(limit, entry))

    async def _read_spend(self, limit: BudgetLimit, entry: _Spend) -> None:
        limit = BudgetLimit(key=limit.key, limit_usd=limit.limit_usd)  # the store's counter alone
        try:
            result = await self._admit_soon([limit], now=self.clock.wall())  # refused or not, it reports the spend
        except Exception:
            self.on_error("lease")
            return
        finally:
            entry.refreshing = False
        if result.spent_usd is not None:
            entry.spent, entry.at = result.spent_usd, self.clock.wall()

    # lifecycle -----------------------------------------------------------------------------------------
    async def _admit_soon(self, limits: list[Limit], *, now: float) -> Admission:
        """A background admit (grant, spend read): on a store that can, it goes with the next request's admit."""
        store = self.store
        if isinstance(store, AdmitsRiding):
            return await store.admit_riding(limits, now=now)
        return await store.admit(limits, now=now)

    def _spawn(self, work: object) -> None:
        assert asyncio.iscoroutine(work)
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def idle(self) -> None:
        """Until every refill and return under way has finished (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """End every lease, returning the unused parts to the store."""
        await self.idle()
        for key, w in list(self._windows.items()):
            if w.debt and w.current is None:
                w.current = _Lease(left=-w.debt, granted_at=self.clock.wall())
                w.debt = 0
            self._end_all(key, w)
        self._windows.clear()
        await self.idle()
