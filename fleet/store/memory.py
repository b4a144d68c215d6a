"""``MemoryStore``: the ``Store`` in process memory, for the embedded one-process mode and for tests.

It runs the same algorithms as ``RedisStore`` (window math from ``fleet.store.window``, slots as
slot id → expiry, records kept as the same JSON text) so the contract suite can demand identical results.
Times that the protocol passes in (``now``) are used as given; TTLs without a ``now`` (worker states,
leases) use the injected clock's monotonic time. All methods run without awaiting, so each is atomic on
the event loop, which is what makes ``admit`` all-or-nothing here.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from itertools import islice

from fleet.budget_period import billed_counters
from fleet.clock import Clock, SystemClock
from fleet.store import window as win
from fleet.store.keys import DocVersionConflict, doc_version, log_collection, scope_of, single_scope
from fleet.store.ledger import TenantLedger
from fleet.store.protocol import (
    LOG_MAX_ENTRIES,
    SETTLE_DEDUPE_S,
    Admission,
    ApiKeyRecord,
    BudgetLimit,
    Limit,
    LogEntry,
    Settlement,
    SlotLimit,
    UsageRecord,
    UsageTotals,
    WindowLimit,
    WorkerState,
)


def in_process(store: object) -> bool:
    """Whether ``store`` lives in this process (a ``MemoryStore``): its calls are function calls, so what saves store
    round trips (leases, batched admits, lingering writes) only adds work in front of it."""
    return isinstance(store, MemoryStore)


class MemoryStore:
    """In-process ``Store``. ``clock`` drives the TTLs of worker states and leases."""

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._windows: dict[str, dict[int, int]] = {}
        self._slots: dict[str, dict[str, float]] = {}
        self._spend: dict[str, float] = {}
        self._spend_expiry: dict[str, float] = {}
        """Period spend counter → when (Unix s) it may be dropped (``fleet.budget_period``)."""
        self._next_spend_expiry = math.inf
        self._settled: dict[str, dict[str, float]] = {}
        """Scope → settle id → when it was applied (Unix s), for ``settle``'s dedupe."""
        self._workers: dict[str, tuple[str, float]] = {}
        self._ejected: dict[str, tuple[float, str]] = {}
        self._leases: dict[str, tuple[str, float]] = {}
        self._replicas: dict[str, float] = {}
        self._tenants: dict[str, TenantLedger] = {}
        self._keys_by_digest: dict[str, str] = {}
        self._digest_by_id: dict[str, str] = {}
        self._revoked: set[str] = set()
        self._docs: dict[str, dict[str, tuple[str, float]]] = {}
        self._logs: dict[str, list[LogEntry]] = {}

    # limits -------------------------------------------------------------------------------------------
    async def admit(self, limits: Sequence[Limit], *, now: float) -> Admission:
        single_scope(lim.key for lim in limits)
        for lim in limits:
            if isinstance(lim, SlotLimit):
                for slot_id in lim.releasing:
                    self._slots.get(lim.key, {}).pop(slot_id, None)
        spent = None
        for lim in limits:
            if isinstance(lim, BudgetLimit):
                spent = self._spend.get(lim.key, 0.0)
            refusal = self._check(lim, now)
            if refusal is not None:
                return Admission(allowed=False, tripped=lim.key, retry_after_s=refusal, spent_usd=spent)
        for lim in limits:
            if isinstance(lim, WindowLimit):
                win.reserve(self._window(lim.key), cost=lim.cost, window_s=lim.window_s, now=now)
            elif isinstance(lim, SlotLimit):
                self._slots.setdefault(lim.key, {})[lim.slot_id] = now + lim.ttl_s
        return Admission(allowed=True, spent_usd=spent)

    def _check(self, lim: Limit, now: float) -> float | None:
        """None when ``lim`` admits; else the retry-after in seconds."""
        if isinstance(lim, WindowLimit):
            buckets = self._window(lim.key)
            win.prune(buckets, window_s=lim.window_s, now=now)
            return win.retry_after(buckets, cost=lim.cost, limit=lim.limit, window_s=lim.window_s, now=now)
        if isinstance(lim, SlotLimit):
            slots = self._slots.setdefault(lim.key, {})
            for slot_id in [s for s, exp in slots.items() if exp <= now]:
                del slots[slot_id]
            if lim.slot_id in slots or len(slots) < lim.limit:
                return None
            return win.SLOT_RETRY_AFTER_S
        assert isinstance(lim, BudgetLimit)
        return 0.0 if self._spend.get(lim.key, 0.0) + lim.pending_usd >= lim.limit_usd else None

    def _window(self, key: str) -> dict[int, int]:
        return self._windows.setdefault(key, {})

    async def settle(
        self,
        *,
        windows: Sequence[WindowLimit],
        slots: Sequence[SlotLimit],
        spend: dict[str, float],
        now: float,
        settle_id: str | None = None,
    ) -> None:
        names = [*(w.key for w in windows), *(s.key for s in slots), *spend]
        single_scope(names)
        windows = [w for w in windows if w.cost != 0]
        if settle_id and (windows or spend) and not self._first_settle(names[0], settle_id, windows, now):
            return
        for w in windows:
            buckets = self._window(w.key)
            win.prune(buckets, window_s=w.window_s, now=now)
            if w.cost > 0:
                win.reserve(buckets, cost=w.cost, window_s=w.window_s, now=now)
            else:
                win.refund(buckets, amount=-w.cost, window_s=w.window_s, now=now, reserved_at=w.reserved_at)
        for s in slots:
            self._slots.get(s.key, {}).pop(s.slot_id, None)
        for key, usd in spend.items():
            self._spend[key] = self._spend.get(key, 0.0) + usd

    def _first_settle(self, name: str, settle_id: str, windows: Sequence[WindowLimit], now: float) -> bool:
        """Remember ``settle_id`` in its scope; False when it was applied within the dedupe period."""
        dedupe_s = max([SETTLE_DEDUPE_S, *(2 * w.window_s for w in windows)])
        seen = self._settled.setdefault(scope_of(name), {})
        expired = []
        for old, at in seen.items():  # oldest first (insertion order), so this stops at the first one kept
            if at >= now - dedupe_s:
                break
            expired.append(old)
        for old in expired:
            del seen[old]
        if settle_id in seen:
            return False
        seen[settle_id] = now
        return True

    async def admit_many(self, calls: Sequence[tuple[Sequence[Limit], float]]) -> list[Admission]:
        return [await self.admit(limits, now=now) for limits, now in calls]

    async def settle_many(self, settlements: Sequence[Settlement], *, now: float) -> None:
        for s in settlements:
            await self.settle(windows=s.windows, slots=s.slots, spend=dict(s.spend), now=now, settle_id=s.settle_id)

    def add_spend(self, key: str, usd: float) -> None:
        """Add ``usd`` to the spend counter ``key`` (this process only: the gateway's fallback during an outage)."""
        self._spend[key] = self._spend.get(key, 0.0) + usd

    async def spent(self, key: str) -> float:
        return self._spend.get(key, 0.0)

    # worker state --------------------------------------------------------------------------------------
    async def publish_worker_state(self, state: WorkerState, *, ttl_s: float) -> None:
        self._workers[state.worker_id] = (state.model_dump_json(), self._clock.monotonic() + ttl_s)

    async def worker_states(self) -> dict[str, WorkerState]:
        now = self._clock.monotonic()
        for worker_id in [w for w, (_, exp) in self._workers.items() if exp <= now]:
            del self._workers[worker_id]
        return {w: WorkerState.model_validate_json(text) for w, (text, _) in self._workers.items()}

    # outlier ejection ----------------------------------------------------------------------------------
    async def eject(self, worker_id: str, *, until: float, reason: str) -> None:
        self._ejected[worker_id] = (until, reason)

    async def ejected(self, *, now: float) -> dict[str, float]:
        for worker_id in [w for w, (until, _) in self._ejected.items() if until <= now]:
            del self._ejected[worker_id]
        return {w: until for w, (until, _) in self._ejected.items()}

    # leader lease --------------------------------------------------------------------------------------
    async def acquire_lease(self, name: str, holder: str, *, ttl_s: float) -> bool:
        current = await self.lease_holder(name)
        if current is not None and current != holder:
            return False
        self._leases[name] = (holder, self._clock.monotonic() + ttl_s)
        return True

    async def release_lease(self, name: str, holder: str) -> None:
        if await self.lease_holder(name) == holder:
            del self._leases[name]

    async def lease_holder(self, name: str) -> str | None:
        lease = self._leases.get(name)
        if lease is None or lease[1] <= self._clock.monotonic():
            self._leases.pop(name, None)
            return None
        return lease[0]

    # gateway replica registry --------------------------------------------------------------------------
    async def replica_heartbeat(self, replica_id: str, *, ttl_s: float, now: float) -> int:
        self._replicas[replica_id] = now + ttl_s
        for gone in [r for r, until in self._replicas.items() if until <= now]:
            del self._replicas[gone]
        return len(self._replicas)

    # usage ledger --------------------------------------------------------------------------------------
    async def append_usage(self, record: UsageRecord) -> None:
        if self._tenants.setdefault(record.tenant, TenantLedger()).append(record) and record.cost_usd > 0:
            for counter in billed_counters(record.tenant, record.at):
                self.add_spend(counter.key, record.cost_usd)
                if counter.expire_at is not None and counter.key not in self._spend_expiry:
                    self._spend_expiry[counter.key] = counter.expire_at
                    self._next_spend_expiry = min(self._next_spend_expiry, counter.expire_at)
            if record.at >= self._next_spend_expiry:
                self._drop_expired_spend(record.at)

    def _drop_expired_spend(self, now: float) -> None:
        """Forget the period counters past their expiry at ``now`` (Unix s): Redis expires them itself."""
        for key in [k for k, until in self._spend_expiry.items() if until <= now]:
            del self._spend_expiry[key]
            self._spend.pop(key, None)
        self._next_spend_expiry = min(self._spend_expiry.values(), default=math.inf)

    async def append_usage_many(self, records: Sequence[UsageRecord]) -> None:
        for record in records:
            await self.append_usage(record)

    async def usage(self, tenant: str, *, since: float, until: float, limit: int = 1000) -> UsageTotals:
        return self._tenants.get(tenant, TenantLedger()).usage(since, until, max(limit, 0))

    async def ledger(self, *, since: float, until: float, limit: int = 1000) -> list[UsageRecord]:
        limit = max(limit, 0)
        parts = [t.texts(since, until, limit) for t in self._tenants.values()]
        merged = heapq.merge(*parts, key=record_order)
        return [UsageRecord.model_validate_json(text) for text in islice(merged, limit)]

    async def usage_tenants(self) -> list[str]:
        return sorted(t for t, ledger in self._tenants.items() if ledger.entries)

    async def ledger_cutoff(self, tenant: str, *, keep: int) -> float | None:
        if keep <= 0:
            raise ValueError("keep must be positive")
        return self._tenants.get(tenant, TenantLedger()).cutoff(keep)

    async def trim_usage(self, tenant: str, *, before: float, expected: int) -> int | None:
        return self._tenants.get(tenant, TenantLedger()).trim(before, expected)

    # API keys ------------------------------------------------------------------------------------------
    async def put_api_key(self, record: ApiKeyRecord) -> None:
        self._keys_by_digest[record.digest] = record.model_dump_json()
        self._digest_by_id[record.key_id] = record.digest

    async def api_key_by_digest(self, digest: str) -> ApiKeyRecord | None:
        text = self._keys_by_digest.get(digest)
        return None if text is None else key_record(text, revoked=digest in self._revoked)

    async def api_keys(self, tenant: str | None = None) -> list[ApiKeyRecord]:
        records = [key_record(t, revoked=d in self._revoked) for d, t in self._keys_by_digest.items()]
        return sort_keys(records, tenant)

    async def revoke_api_key(self, key_id: str) -> bool:
        digest = self._digest_by_id.get(key_id)
        if digest is None:
            return False
        self._revoked.add(digest)
        return True

    # shared documents and logs -------------------------------------------------------------------------
    async def put_doc(self, collection: str, doc_id: str, body: str, *, ttl_s: float | None = None) -> None:
        expires = float("inf") if ttl_s is None else self._clock.monotonic() + ttl_s
        self._docs.setdefault(collection, {})[doc_id] = (body, expires)

    async def get_doc(self, collection: str, doc_id: str) -> str | None:
        return (await self.docs(collection)).get(doc_id)

    async def docs(self, collection: str) -> dict[str, str]:
        now, docs = self._clock.monotonic(), self._docs.get(collection, {})
        for doc_id in [d for d, (_, exp) in docs.items() if exp <= now]:
            del docs[doc_id]
        return {d: body for d, (body, _) in docs.items()}

    async def delete_doc(self, collection: str, doc_id: str) -> bool:
        existed = doc_id in await self.docs(collection)
        self._docs.get(collection, {}).pop(doc_id, None)
        return existed

    async def put_doc_logged(
        self,
        collection: str,
        doc_id: str,
        body: str | None,
        *,
        log: str,
        entry: str,
        now: float,
        expect_version: int | None = None,
    ) -> None:
        log_collection(log, collection)  # checked before either write; nothing below awaits
        if expect_version is not None:
            found = doc_version(self._docs.get(collection, {}).get(doc_id, (None, 0.0))[0])
            if found != expect_version:
                raise DocVersionConflict(found, expect_version)
        if body is None:
            self._docs.get(collection, {}).pop(doc_id, None)
        else:
            self._docs.setdefault(collection, {})[doc_id] = (body, float("inf"))
        await self.append_log(log, entry, now=now)

    async def append_log(self, log: str, body: str, *, now: float) -> None:
        entries = self._logs.setdefault(log, [])
        entries.append(LogEntry(at=now, body=body))
        del entries[:-LOG_MAX_ENTRIES]

    async def read_log(self, log: str, *, since: float, until: float, limit: int = 1000) -> list[LogEntry]:
        found = sorted((e for e in self._logs.get(log, []) if since <= e.at < until), key=lambda e: e.at)
        return found[: max(limit, 0)]

    # lifecycle -----------------------------------------------------------------------------------------
    async def verify(self) -> None:
        return None

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None


def record_order(text: str) -> tuple[float, str]:
    """Sort key of a stored record's JSON text: its time, then the text (the order of a Redis sorted set)."""
    return UsageRecord.model_validate_json(text).at, text


def key_record(text: str, *, revoked: bool) -> ApiKeyRecord:
    """Parse a stored key record, marking it revoked when the revocation set says so; shared by both stores."""
    record = ApiKeyRecord.model_validate_json(text)
    return record.model_copy(update={"revoked": True}) if revoked and not record.revoked else record


def sort_keys(records: list[ApiKeyRecord], tenant: str | None) -> list[ApiKeyRecord]:
    """``records`` of ``tenant`` (all when None), oldest first; shared by both stores."""
    chosen = [r for r in records if tenant is None or r.tenant == tenant]
    return sorted(chosen, key=lambda r: (r.created_at, r.key_id))
