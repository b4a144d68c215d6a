"""The ``Store`` protocol: all state that gateway replicas and controllers share (DESIGN §3.3).

Limit names are ``<kind>:<scope>`` (the scope is the tenant) and one ``admit`` or ``settle`` call keeps to one
scope, so on Redis Cluster it touches one slot (``fleet.store.keys``).

Two implementations with the same semantics: ``fleet.store.memory.MemoryStore`` (one process, the embedded
mode) and ``fleet.store.redis.RedisStore`` (replicas on a real Redis). One contract test suite runs against
both. Every method is one round trip on Redis; ``admit`` checks and reserves all of a request's limits
atomically in one round trip, so the gateway's hot path pays one store call to admit; settlements go after the
response, many in one round trip (``settle_many``), and spend comes with the usage record (``append_usage``).
All times are Unix seconds; money is USD; token counts are tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict


# ------------------------------------------------------------------------------------------------ limits
@dataclass(frozen=True, slots=True)
class WindowLimit:
    """At most ``limit`` units (requests or tokens) per rolling ``window_s`` under ``key``; reserve ``cost``.

    In ``settle``, ``cost`` is the correction and ``reserved_at`` (Unix s, optional) the ``now`` of the
    ``admit`` that reserved it: a refund then lowers only that reservation's part of the window and is dropped
    once the reservation has left the window. One key must always be used with the same ``window_s``."""

    key: str
    cost: int
    limit: int
    window_s: float = 60.0
    reserved_at: float | None = None


@dataclass(frozen=True, slots=True)
class SlotLimit:
    """At most ``limit`` concurrent holders of ``key``; this request holds ``slot_id`` until released or
    until ``ttl_s`` passes (a crashed gateway's slots free themselves)."""

    key: str
    slot_id: str
    limit: int
    ttl_s: float = 600.0
    releasing: tuple[str, ...] = ()
    """Slot ids of ``key`` whose requests have finished but whose release has not reached the store yet (the
    caller's own accounting): ``admit`` frees them before it checks, so a client's next request is never
    refused for its own finished one. Releasing an id twice is harmless."""


@dataclass(frozen=True, slots=True)
class BudgetLimit:
    """Refuse when the spend counter ``key`` plus ``pending_usd`` (USD the caller has metered but the store has not
    yet billed) has reached ``limit_usd``."""

    key: str
    limit_usd: float
    pending_usd: float = 0.0


Limit = WindowLimit | SlotLimit | BudgetLimit


@dataclass(frozen=True, slots=True)
class Admission:
    """Result of ``Store.admit``. On refusal nothing was reserved; ``tripped`` is the key of the first
    limit that refused and ``retry_after_s`` when it would admit the same request again."""

    allowed: bool
    tripped: str | None = None
    retry_after_s: float = 0.0
    spent_usd: float | None = None
    """The request's budget spend counter (USD, without ``pending_usd``) as the store read it while checking, when
    the request had a budget limit and the check reached it: the last known spend a gateway enforces while the
    store is away (issue 23)."""


SETTLE_DEDUPE_S = 120.0
"""How long a settled id is remembered (``Store.settle``): twice the rolling windows' 60 s."""


@dataclass(frozen=True, slots=True)
class Settlement:
    """The arguments of one ``Store.settle`` call, as data (the gateway spools and replays them)."""

    settle_id: str
    windows: tuple[WindowLimit, ...] = ()
    slots: tuple[SlotLimit, ...] = ()
    spend: tuple[tuple[str, float], ...] = ()


# ---------------------------------------------------------------------------------------- shared records
class WorkerState(BaseModel):
    """What the controller publishes about a worker for the gateway's routing and metering (TTL'd)."""

    model_config = ConfigDict(extra="ignore")

    worker_id: str
    model: str
    k_desired: int
    k_applied: int
    accepted_length: float
    """Mean tokens per step per sequence (1 + accepted/drafts) at the applied k."""
    acceptance_per_pos: list[float] = []
    tpot_predicted_s: float | None = None
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    """Fraction of the KV cache in use, 0…1."""
    usd_per_mtok: float | None = None
    """Cost per million output tokens including the drafter and rejected drafts, USD."""
    usd_per_mtok_k0: float | None = None
    """The modelled cost per million output tokens of the same load at k = 0 (no speculation), USD."""
    drafter_share: float | None = None
    """The drafter's share of the worker's cost, 0…1."""
    overloaded: bool = False
    """No candidate k meets the TPOT target of the tiers this worker serves: steer or shed load."""
    stale: bool = False
    reason: str = ""
    updated_at: float = 0.0


class UsageRecord(BaseModel):
    """One metered request, appended to the ledger. Costs in USD, times in seconds."""

    model_config = ConfigDict(extra="ignore")

    request_id: str
    tenant: str
    model: str
    worker_id: str | None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    status: str
    """``ok``, ``error`` or ``cancelled``."""
    ttft_s: float | None = None
    tpot_s: float | None = None
    at: float
    """When the request finished, Unix seconds."""
    arrived_at: float | None = None
    """When the request reached the gateway, Unix seconds (a replayed trace's arrival time)."""
    tier: str | None = None
    """The tenant's tier when the request was served."""
    admitted_at: float | None = None
    """When admission granted the request (its limits reserved), Unix seconds; None for a tenant without limits."""
    workload: str | None = None
    """The request's workload hint (``x-gearshift-workload`` or the tenant's default), when it had one."""
    cached_tokens: int = 0
    """Prompt tokens served from the worker's prefix cache (``prompt_tokens_details.cached_tokens``)."""
    session: str | None = None
    """The client's session (``x-gearshift-session``): a replay sends a session's turns closed-loop."""
    speculation: str | None = None
    """The request's speculation mode (``auto``, ``off`` or ``fast``: its tier's, or its ``x-gearshift-speculation``
    header's); None in records written before issue 25."""


class ApiKeyRecord(BaseModel):
    """An API key created through the admin API; only its keyed digest is kept."""

    key_id: str
    tenant: str
    digest: str
    created_at: float
    revoked: bool = False


@dataclass(frozen=True, slots=True)
class UsageTotals:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    records: Sequence[UsageRecord] = field(default_factory=tuple)


# ------------------------------------------------------------------------------------------------- store
LOG_MAX_ENTRIES = 100_000
"""An append-only log keeps about this many newest entries (Redis trims approximately)."""


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One entry of an append-only log: when (Unix s) and the caller's JSON text."""

    at: float
    body: str


class Store(Protocol):
    # limits -------------------------------------------------------------------------------------------
    async def admit(self, limits: Sequence[Limit], *, now: float) -> Admission:
        """Check every limit and, only if all pass, reserve them all (all-or-nothing, atomic)."""
        ...

    async def admit_many(self, calls: Sequence[tuple[Sequence[Limit], float]]) -> list[Admission]:
        """``admit`` each ``(limits, now)`` of ``calls``, in order, each atomic on its own, in one round trip on one
        Redis (pipelined; on a cluster, one per node): the gateway batches the admits of one event-loop tick."""
        ...

    async def settle(
        self,
        *,
        windows: Sequence[WindowLimit],
        slots: Sequence[SlotLimit],
        spend: dict[str, float],
        now: float,
        settle_id: str | None = None,
    ) -> None:
        """After a request: correct each window by ``cost`` (negative refunds an over-reservation), release
        the slots, and add ``spend`` (key → USD) to the spend counters. One round trip.

        With ``settle_id`` (the request id) a settlement is applied once: a replay of the same id is skipped for
        ``SETTLE_DEDUPE_S`` (at least as long as any of its windows), after which its refunds would be dropped
        anyway (the reservation has left the window); releasing a slot is idempotent at any time."""
        ...

    async def settle_many(self, settlements: Sequence[Settlement], *, now: float) -> None:
        """``settle`` each of ``settlements`` (by its ``settle_id``), in one round trip on one Redis (pipelined;
        on a cluster, one per node)."""
        ...

    async def spent(self, key: str) -> float:
        """Current value of a spend counter, USD."""
        ...

    # worker state (controller → gateway) ---------------------------------------------------------------
    async def publish_worker_state(self, state: WorkerState, *, ttl_s: float) -> None: ...
    async def worker_states(self) -> dict[str, WorkerState]:
        """Every unexpired published worker state, by worker id."""
        ...

    # outlier ejection (shared by gateway replicas) ------------------------------------------------------
    async def eject(self, worker_id: str, *, until: float, reason: str) -> None: ...
    async def ejected(self, *, now: float) -> dict[str, float]:
        """Worker id → ejected-until (Unix s) for every ejection still in force."""
        ...

    # leader lease (controller HA) ----------------------------------------------------------------------
    async def acquire_lease(self, name: str, holder: str, *, ttl_s: float) -> bool:
        """Take the lease if free or expired, or renew it if ``holder`` has it. True when ``holder`` holds it."""
        ...

    async def release_lease(self, name: str, holder: str) -> None: ...
    async def lease_holder(self, name: str) -> str | None: ...

    # gateway replica registry ---------------------------------------------------------------------------
    async def replica_heartbeat(self, replica_id: str, *, ttl_s: float, now: float) -> int:
        """Register ``replica_id`` as alive until ``now + ttl_s`` (Unix s) and return how many replicas are
        alive at ``now``, this one included (each replica then enforces limit / count while the store is away)."""
        ...

    # usage ledger ---------------------------------------------------------------------------------------
    async def append_usage(self, record: UsageRecord) -> None:
        """Append to the ledger (append-only), add the record to the tenant's totals and its ``cost_usd`` to the
        tenant's spend counter (``fleet.store.keys.spend_key``): spend is billed with the record, exactly once."""
        ...

    async def append_usage_many(self, records: Sequence[UsageRecord]) -> None:
        """``append_usage`` for each record, in order. A record whose request id is already in the ledger is
        skipped, so replaying a batch bills nothing twice. On Redis, one round trip per tenant in the batch, each
        all-or-nothing (a tenant's ledger lives in its own cluster slot)."""
        ...

    async def usage(self, tenant: str, *, since: float, until: float, limit: int = 1000) -> UsageTotals:
        """A tenant's totals over every record with ``since <= at < until``, and the first ``limit`` of those
        records in time order (the totals are exact whatever ``limit`` is)."""
        ...

    async def ledger(self, *, since: float, until: float, limit: int = 1000) -> list[UsageRecord]:
        """Fleet-wide: the first ``limit`` records of every tenant with ``since <= at < until``, in time order
        (each tenant's ledger merged by ``at``)."""
        ...

    async def usage_tenants(self) -> list[str]:
        """Tenants with records in the ledger, sorted."""
        ...

    async def ledger_cutoff(self, tenant: str, *, keep: int) -> float | None:
        """The ``at`` of the oldest of the tenant's newest ``keep`` records (``keep`` > 0), None when it has no more
        than ``keep``: retention by size trims what is older (``fleet.store.retention``)."""
        ...

    async def trim_usage(self, tenant: str, *, before: float, expected: int) -> int | None:
        """Retention: remove the tenant's records with ``at < before`` (their request ids too: a replay of one is
        billed again, so retain longer than any spool outage) if exactly ``expected`` are there, which the caller
        has just exported; None, and nothing removed, when another number is there (a late record arrived).
        Totals read later count only what is left; spend counters are not touched. Returns how many it removed."""
        ...

    # API keys created at run time -----------------------------------------------------------------------
    async def put_api_key(self, record: ApiKeyRecord) -> None: ...
    async def api_key_by_digest(self, digest: str) -> ApiKeyRecord | None: ...
    async def api_keys(self, tenant: str | None = None) -> list[ApiKeyRecord]: ...
    async def revoke_api_key(self, key_id: str) -> bool: ...

    # shared documents and logs (plans, run-time tenants, worker modes, the admin audit trail) -----------
    async def put_doc(self, collection: str, doc_id: str, body: str, *, ttl_s: float | None = None) -> None:
        """Store ``body`` (a JSON text the caller's schema owns) as ``doc_id`` in ``collection``, replacing any
        earlier one; with ``ttl_s`` it expires after that many seconds. A collection lives in one cluster slot."""
        ...

    async def get_doc(self, collection: str, doc_id: str) -> str | None: ...
    async def docs(self, collection: str) -> dict[str, str]:
        """Every unexpired document of ``collection``, by id."""
        ...

    async def delete_doc(self, collection: str, doc_id: str) -> bool:
        """Remove one document; True when it existed."""
        ...

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
        """All or nothing: store ``body`` as ``doc_id`` in ``collection`` (``put_doc``, no TTL; None deletes it) and
        append ``entry`` to ``log`` at ``now`` (``append_log``). ``log`` must live with ``collection``
        (``fleet.store.keys.LOG_SLOTS``: one cluster slot; ``ScopeMismatch`` otherwise). On Redis one script call
        that checks every key's type before it writes anything.

        With ``expect_version``, only if the stored document's top-level ``version`` (``fleet.store.keys.doc_version``:
        0 when there is none) equals it, checked in the same atomic step (optimistic concurrency between replicas);
        else ``DocVersionConflict`` and nothing written."""
        ...

    async def append_log(self, log: str, body: str, *, now: float) -> None:
        """Append ``body`` at time ``now`` (Unix s) to the append-only ``log`` (its newest ``LOG_MAX_ENTRIES``
        are kept)."""
        ...

    async def read_log(self, log: str, *, since: float, until: float, limit: int = 1000) -> list[LogEntry]:
        """The first ``limit`` entries of ``log`` with ``since <= at < until``, oldest first."""
        ...

    # lifecycle ------------------------------------------------------------------------------------------
    async def verify(self) -> None:
        """Raise ``fleet.store.keys.StoreMisconfigured`` when the store is not what the settings say (a Redis
        Cluster node without ``GEARSHIFT_REDIS_CLUSTER=true``, or the reverse). Call once at start; a store that
        cannot be reached passes (the failure mode handles outages)."""
        ...

    async def ping(self) -> bool: ...
    async def close(self) -> None: ...


@runtime_checkable
class AdmitsRiding(Protocol):
    """A store whose background admits may wait for the next request's admit and go with it (``RedisStore``:
    ``fleet.store.rides``): one command for both."""

    async def admit_riding(self, limits: Sequence[Limit], *, now: float) -> Admission:
        """``Store.admit``, sent with the next admit when one comes within a moment (a lease grant, a spend read)."""
        ...
