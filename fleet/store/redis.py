"""``RedisStore``: the ``Store`` on a real Redis or Redis Cluster (redis-py's asyncio clients), shared by gateway
replicas and controllers. Every key starts with the configured prefix (``gearshift:`` by default).

Why hand-written Lua rather than the ``limits`` library: ``limits`` checks and hits one limit at a time,
with its own clock, and has no way to refund part of a hit. The gateway needs every limit of a request
(requests per minute, tokens per minute, concurrency, budget) checked and reserved all-or-nothing in one
round trip, on one clock for every replica (Redis's ``TIME``; the caller's ``now`` with ``server_clock=False``,
for virtual-time tests) and token reservations reconciled afterwards. So ``admit`` and ``settle`` are single Lua
scripts (EVALSHA, falling back to EVAL when Redis lost its script cache, for example after a restart) running the
rolling-window math of ``fleet.store.window``, which ``MemoryStore`` runs in Python: on the same clock the two agree
exactly.

Key layout: ``fleet.store.keys`` (every script's keys share one hash tag, so the same code runs on one Redis,
on a primary with replicas, and on Redis Cluster through redis-py's asyncio ``RedisCluster`` when
``cluster=True``). A tenant's ledger is four keys in the tenant's slot: ``stream`` (the append-only ledger, one
entry per record in append order, fields ``tenant`` and ``record``), ``index`` (sorted set at → record JSON, which
``usage`` reads by time), ``rollup`` (hourly and per-minute totals, see ``fleet.store.ledger``: ``usage`` sums whole
hours and minutes and at most two minutes of single records) and ``ids`` (the request ids already billed, so an
append is idempotent by request id). Fleet-wide reads (``ledger``) merge the tenants' indexes by time, the tenants
coming from the ``{ledger}:tenants`` set.

Rides (``fleet.store.rides``): while admits flow, the ledger appends, settlements, lease grants and spend reads
(``admit_riding``) and the background reads wait a moment for the next admit and go in its script call
(``lua.BUNDLE``), so a gateway serving a sequential client sends one command per request.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import heapq
import math
import uuid
from collections.abc import Awaitable, Callable, Sequence
from itertools import islice
from typing import Any, cast

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import PipelineCommand, RedisCluster
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fleet.budget_period import billed_counters
from fleet.store import lua
from fleet.store import rides as riding
from fleet.store import window as win
from fleet.store.cancel import cancellation_safe, cancelling_now, checks_own_cancellation, raise_if_cancelled_since
from fleet.store.keys import (
    SCHEMA_VERSION,
    DocVersionConflict,
    KeyLayout,
    StoreMisconfigured,
    log_collection,
    scope_of,
    settled_key,
    single_scope,
)
from fleet.store.ledger import ROLLUP_SIZES_S
from fleet.store.memory import key_record, record_order, sort_keys
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
from fleet.store.resp import RespConnection, as_error
from fleet.store.rides import BACKGROUND_RIDE_S, RIDE_S, Rider, Rides

DEFAULT_PREFIX = "gearshift:"
WAIT_TIMEOUT_S = 0.5
"""The longest a ledger append waits for its replicas (``wait_replicas``), seconds."""


class NotReplicated(RedisError):
    """Fewer replicas than asked acknowledged a ledger write in time: it may not survive a failover."""


_RETRIES = 1
"""Retries of a call whose connection failed (each on a fresh connection)."""


def sentinel_addresses(text: str) -> list[tuple[str, int]]:
    """``host:port,host:port`` (``GEARSHIFT_REDIS_SENTINELS``) as ``(host, port)`` pairs."""
    pairs = []
    for item in (part.strip() for part in text.split(",")):
        host, sep, port = item.rpartition(":")
        if not (sep and host and port.isdigit()):
            raise ValueError(f"GEARSHIFT_REDIS_SENTINELS: {item!r} is not host:port")
        pairs.append((host, int(port)))
    return pairs


def _num(x: float) -> str:
    """A float as text that Lua's ``tonumber`` reads back as the same double."""
    return repr(float(x))


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def _limit_args(lim: Limit) -> list[str]:
    if isinstance(lim, WindowLimit):
        return ["w", str(lim.cost), str(lim.limit), _num(lim.window_s)]
    if isinstance(lim, SlotLimit):
        return ["s", lim.slot_id, str(lim.limit), _num(lim.ttl_s)]
    assert isinstance(lim, BudgetLimit)
    return ["b", _num(lim.limit_usd), _num(lim.pending_usd), ""]


def _settle_part(keys: KeyLayout, s: Settlement) -> tuple[str, list[str], list[str], float] | None:
    """The scope, KEYS and ARGV of ``s`` within a settle script call (``lua.SETTLE``) and how long its id must be
    remembered, or None when it has nothing to do."""
    windows = [w for w in s.windows if w.cost != 0]
    if not (windows or s.slots or s.spend):
        return None
    names = [w.key for w in windows] + [sl.key for sl in s.slots] + [k for k, _ in s.spend]
    single_scope(names)
    dedupe = bool(s.settle_id) and bool(windows or s.spend)  # releasing a slot twice is harmless
    args = [s.settle_id if dedupe else "", str(len(windows)), str(len(s.slots)), str(len(s.spend))]
    for w in windows:
        args += [str(w.cost), _num(w.window_s), "" if w.reserved_at is None else _num(w.reserved_at)]
    args += [sl.slot_id for sl in s.slots]
    args += [_num(usd) for _, usd in s.spend]
    scope = scope_of(names[0])
    key_names = names + ([settled_key(scope)] if dedupe else [])
    dedupe_s = max([SETTLE_DEDUPE_S, *(2 * w.window_s for w in windows)])
    return scope, [keys.limit(n) for n in key_names], args, dedupe_s


def _settle_calls(
    keys: KeyLayout, settlements: Sequence[Settlement], *, now: float, clock_flag: str
) -> list[tuple[str, list[str], list[str]]]:
    """One settle script call (scope, KEYS, ARGV) per scope: a scope's settlements, in order, in one call."""
    by_scope: dict[str, list[tuple[list[str], list[str], float]]] = {}
    for s in settlements:
        part = _settle_part(keys, s)
        if part is not None:
            by_scope.setdefault(part[0], []).append(part[1:])
    calls = []
    for scope, parts in by_scope.items():
        dedupe_s = max(d for _, _, d in parts)
        call_keys = [k for ks, _, _ in parts for k in ks]
        head = [_num(now), str(win.BUCKETS_PER_WINDOW), _num(dedupe_s), clock_flag]
        call_args = head + [a for _, args, _ in parts for a in args]
        calls.append((scope, call_keys, call_args))
    return calls


_Call = tuple[str, Sequence[str], Sequence[str]]
"""One call in a bundle: a script of ``lua.BUNDLED`` by name, its KEYS and its ARGV."""


def _bundle_call(calls: Sequence[_Call]) -> tuple[list[str], list[str]]:
    """The KEYS and ARGV of one ``lua.BUNDLE`` call running ``calls`` in order."""
    keys: list[str] = []
    head = [str(len(calls))]
    rest: list[str] = []
    for script, call_keys, call_args in calls:
        head += [lua.BUNDLE_INDEX[script], str(len(call_keys)), str(len(call_args))]
        keys += call_keys
        rest += call_args
    return keys, head + rest


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a background send's error as seen (its riders and its caller, if still there, got it)."""
    if not task.cancelled():
        task.exception()


class _Script:
    """One Lua script, run with EVALSHA (EVAL, which also caches it, when Redis answers NOSCRIPT).

    Cheaper than redis-py's ``AsyncScript`` on the hot path (no per-call type checks), and it carries the
    dropped-cancellation check of ``fleet.store.cancel`` itself so the hot methods need no wrapper."""

    __slots__ = ("_client", "_execute", "_fast", "_name", "_text", "sha")

    def __init__(
        self, client: Redis | RedisCluster, text: str, name: str, *, fast: RespConnection | None = None
    ) -> None:
        self._client = client
        self._fast = fast
        """The lean connection the script runs on instead of ``client`` (``fleet.store.resp``), if any."""
        self._execute: Callable[..., Awaitable[Any]] = client.execute_command if fast is None else fast.call
        self._text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()
        self._name = name

    async def __call__(self, keys: Sequence[str], args: Sequence[str]) -> Any:
        task, before = cancelling_now()
        try:
            reply = await self._execute("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            reply = await self._execute("EVAL", self._text, len(keys), *keys, *args)
        raise_if_cancelled_since(task, before, self._name)
        return reply

    async def many(self, calls: Sequence[tuple[Sequence[str], Sequence[str]]]) -> list[Any]:
        """Run the script once per (keys, args) in ``calls`` in one pipeline (not a transaction: on a cluster the
        calls may live on different nodes); raise the first error after every call was tried. Returns the replies,
        in order."""
        task, before = cancelling_now()
        replies: list[Any]
        if self._fast is not None:
            replies = await self._fast.pipeline([("EVALSHA", self.sha, len(k), *k, *a) for k, a in calls])
        else:
            async with self._client.pipeline(transaction=False) as pipe:
                for keys, args in calls:
                    pipe.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
                replies = await pipe.execute(raise_on_error=False)
        for i, ((keys, args), reply) in enumerate(zip(calls, replies, strict=True)):
            if isinstance(reply, NoScriptError):
                replies[i] = await self._execute("EVAL", self._text, len(keys), *keys, *args)
        raise_if_cancelled_since(task, before, self._name)
        failed = [r for r in replies if isinstance(r, Exception)]
        if failed:
            raise failed[0]
        return replies


def _admission(limits: Sequence[Limit], reply: list[Any]) -> Admission:
    spent = float(reply[-1]) if reply[-1] != "" else None
    if int(reply[0]) == 1:
        return Admission(allowed=True, spent_usd=spent)
    tripped = limits[int(reply[1]) - 1].key
    return Admission(allowed=False, tripped=tripped, retry_after_s=float(reply[2]), spent_usd=spent)


@cancellation_safe
class RedisStore:
    """``Store`` on Redis or Redis Cluster. Owns ``client`` (``close`` closes it); build one with ``from_url``."""

    def __init__(
        self,
        client: Redis | RedisCluster,
        *,
        prefix: str = DEFAULT_PREFIX,
        wait_replicas: int = 0,
        wait_timeout_s: float = WAIT_TIMEOUT_S,
        sentinel: Sentinel | None = None,
        server_clock: bool = True,
        fast: RespConnection | None = None,
        ride_s: float = RIDE_S,
    ) -> None:
        self._redis = client
        self._fast = fast
        """The lean connection of the hot scripts (admit, settle: ``fleet.store.resp``); None: on ``client``."""
        self._clock_flag = "1" if server_clock else ""
        """Limits run on Redis's ``TIME`` (default) so replicas' clocks do not matter, else on the caller's ``now``
        (virtual-time tests; ``fleet.store.lua``)."""
        self._sentinel = sentinel
        """The Sentinels ``client`` finds its primary through (closed with it), if any."""
        self._wait_replicas = wait_replicas
        self._wait_ms = _ms(wait_timeout_s)
        self._keys = KeyLayout(prefix)
        self._known_tenants: set[str] = set()
        """Tenants already in the ``{ledger}:tenants`` set (so an append adds them once per process)."""
        self._admit = _Script(client, lua.ADMIT, "RedisStore.admit", fast=fast)
        self._admit_many = _Script(client, lua.ADMIT_MANY, "RedisStore.admit_many", fast=fast)
        self._settle = _Script(client, lua.SETTLE, "RedisStore.settle", fast=fast)
        self._worker_states = _Script(client, lua.WORKER_STATES, "RedisStore.worker_states")
        self._docs = _Script(client, lua.DOCS, "RedisStore.docs")
        self._acquire = _Script(client, lua.ACQUIRE_LEASE, "RedisStore.acquire_lease")
        self._release = _Script(client, lua.RELEASE_LEASE, "RedisStore.release_lease")
        self._heartbeat = _Script(client, lua.REPLICA_HEARTBEAT, "RedisStore.replica_heartbeat")
        self._append = _Script(client, lua.APPEND_USAGE, "RedisStore.append_usage_many")
        self._usage = _Script(client, lua.USAGE, "RedisStore.usage")
        self._trim = _Script(client, lua.TRIM_USAGE, "RedisStore.trim_usage")
        self._revoke = _Script(client, lua.REVOKE_KEY, "RedisStore.revoke_api_key")
        self._put_doc_logged = _Script(client, lua.PUT_DOC_LOGGED, "RedisStore.put_doc_logged")
        self._rollup_args = [str(len(ROLLUP_SIZES_S))] + [_num(size) for size in ROLLUP_SIZES_S]
        self._ejected = _Script(client, lua.EJECTED, "RedisStore.ejected")
        self._bundle = _Script(client, lua.BUNDLE, "RedisStore.bundle", fast=fast)
        self._rides = Rides(wait_s=ride_s, scoped=isinstance(client, RedisCluster))
        """Calls waiting for the next admit to carry them (``fleet.store.rides``; ``ride_s`` 0: none wait)."""
        self._background_ride_s = max(ride_s, BACKGROUND_RIDE_S)
        """How long the calls that only background loops wait for may wait for an admit."""

    @property
    def cluster(self) -> bool:
        """True when the client is a Redis Cluster client."""
        return isinstance(self._redis, RedisCluster)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        cluster: bool = False,
        max_connections: int = 512,
        wait_s: float = 5.0,
        wait_replicas: int = 0,
        server_clock: bool = True,
        ride_s: float = RIDE_S,
    ) -> RedisStore:
        """A store on a new pool of at most ``max_connections`` connections to ``url`` (``redis://host:port/db``);
        opening a connection gives up after ``wait_s`` seconds. The pool is redis-py's plain ``ConnectionPool``:
        its ``BlockingConnectionPool`` cost the gateway a lock and a condition wait on every call, which showed
        at 64 concurrent requests; the cap is far above a gateway's concurrent store calls, so it is never hit.
        With ``cluster``, ``url`` is any node of a Redis Cluster and the pool is one per node (same cap); call
        ``verify`` before concurrent use: it discovers the cluster once (redis-py 8.1's lazy discovery, raced by
        a burst of first calls, breaks some of them).

        A connection that fails (for example one left idle across a Redis restart) is reconnected and the call
        retried once after a short back-off, so a restart costs no caller an error once Redis is back. On a single
        Redis (not a cluster) the hot scripts, admit and settle, run on one lean pipelined connection instead
        (``fleet.store.resp``: a fraction of redis-py's CPU per call), reconnected on the next call after a loss.

        With ``wait_replicas``, a ledger append returns only once that many replicas of the tenant's master have it
        (``WAIT``, at most ``WAIT_TIMEOUT_S``), else raises ``NotReplicated`` (the gateway then spools the records
        and replays them; the ledger skips those already there).

        ``server_clock`` (the default) runs the limits on Redis's own clock; False runs them on the ``now`` the caller
        passes, for tests that drive virtual time. While admits flow, the ledger appends, settlements, lease grants
        and background reads wait up to ``ride_s`` for the next admit and go in its script call (``fleet.store.rides``);
        0 sends each alone."""
        retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), _RETRIES)
        if cluster:
            client = RedisCluster.from_url(
                url,
                max_connections=max_connections,
                socket_connect_timeout=wait_s,
                decode_responses=True,
                retry=retry,
            )
            return cls(client, prefix=prefix, wait_replicas=wait_replicas, server_clock=server_clock, ride_s=ride_s)
        pool = ConnectionPool.from_url(
            url,
            max_connections=max_connections,
            socket_connect_timeout=wait_s,
            decode_responses=True,
            retry=retry,
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
        )
        fast = RespConnection(url, connect_timeout_s=wait_s) if url.startswith("redis://") else None
        return cls(Redis.from_pool(pool), prefix=prefix, wait_replicas=wait_replicas, server_clock=server_clock,
                   fast=fast, ride_s=ride_s)  # fmt: skip

    @classmethod
    def from_sentinels(
        cls,
        sentinels: Sequence[tuple[str, int]],
        *,
        master: str,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        max_connections: int = 512,
        wait_s: float = 5.0,
        wait_replicas: int = 0,
    ) -> RedisStore:
        """A store on the primary that ``sentinels`` (``(host, port)``) know as ``master``, with ``url``'s password
        and database. redis-py's Sentinel pool asks them for the primary before each new connection, so after a
        failover the retried call reaches the promoted replica."""
        options: dict[str, Any] = {k: v for k, v in parse_url(url).items() if k in ("username", "password", "db")}
        options |= {
            "max_connections": max_connections,
            "socket_connect_timeout": wait_s,
            "decode_responses": True,
            "retry": Retry(ExponentialBackoff(cap=0.5, base=0.05), _RETRIES),
            "retry_on_error": [RedisConnectionError, RedisTimeoutError],
        }
        sentinel = Sentinel(list(sentinels), socket_connect_timeout=wait_s)  # type: ignore[no-untyped-call]  # redis-py 8.1 leaves it untyped
        client = sentinel.master_for(master, **options)
        return cls(client, prefix=prefix, wait_replicas=wait_replicas, sentinel=sentinel)

    # limits -------------------------------------------------------------------------------------------
    @checks_own_cancellation
    async def admit(self, limits: Sequence[Limit], *, now: float) -> Admission:
        if not limits:
            return Admission(allowed=True)
        rides = self._rides
        rides.admitting()
        if rides.waiting and (riders := rides.take(scope_of(limits[0].key))):
            keys, args = self._admit_many_call([(limits, now)])
            (group,) = await self._carry(riders, [("admit_many", keys, args)])
            return _admission(limits, group[0])
        keys, args = self._admit_call(limits, now)
        return _admission(limits, await self._admit(keys=keys, args=args))

    async def admit_riding(self, limits: Sequence[Limit], *, now: float) -> Admission:
        """``admit``, carried by the next admit while admits flow (``fleet.store.rides``): lease grants and spend
        reads, which can wait a moment."""
        if not limits:
            return Admission(allowed=True)
        keys, args = self._admit_many_call([(limits, now)])
        alone = functools.partial(self._admit_many, keys=keys, args=args)
        scope = scope_of(limits[0].key)
        (reply,) = await self._rides.ride("admit_many", keys, args, scope, alone, wait_s=self._background_ride_s)
        return _admission(limits, reply)

    @checks_own_cancellation
    async def admit_many(self, calls: Sequence[tuple[Sequence[Limit], float]]) -> list[Admission]:
        """One ``ADMIT_MANY`` script call per scope (a tenant's admits of one tick are one command, not one each),
        the scopes' calls pipelined (on a cluster they may live on different nodes)."""
        by_scope: dict[str, list[int]] = {}
        for i, (limits, _) in enumerate(calls):
            if limits:
                by_scope.setdefault(scope_of(limits[0].key), []).append(i)
        scripts = [self._admit_many_call([calls[i] for i in indices]) for indices in by_scope.values()]
        rides = self._rides
        rides.admitting()
        # a cluster's several scopes go pipelined, without a bundle: take riders only when one script carries them
        # (a rider taken and not carried would never hear back, and its caller would wait forever: issue 23)
        carries = len(scripts) == 1 or not self.cluster
        riders = rides.take(next(iter(by_scope))) if carries and rides.waiting and by_scope else []
        if len(scripts) == 1 and not riders:
            groups = [await self._admit_many(keys=scripts[0][0], args=scripts[0][1])]
        elif len(scripts) == 1 or (scripts and not self.cluster):  # on one Redis, every scope in one script call
            groups = await self._carry(riders, [("admit_many", keys, args) for keys, args in scripts])
        else:
            groups = await self._admit_many.many(scripts) if scripts else []
        results = [Admission(allowed=True)] * len(calls)
        for indices, replies in zip(by_scope.values(), groups, strict=True):
            for i, reply in zip(indices, replies, strict=True):
                results[i] = _admission(calls[i][0], reply)
        return results

    def _admit_many_call(self, calls: Sequence[tuple[Sequence[Limit], float]]) -> tuple[list[str], list[str]]:
        keys: list[str] = []
        args = [_num(calls[0][1]), str(win.BUCKETS_PER_WINDOW), _num(win.SLOT_RETRY_AFTER_S), self._clock_flag]
        for limits, now in calls:
            call_keys, call_args = self._admit_parts(limits)
            keys += call_keys
            args += [_num(now), str(len(call_keys)), *call_args]
        return keys, args

    def _admit_call(self, limits: Sequence[Limit], now: float) -> tuple[list[str], list[str]]:
        keys, limit_args = self._admit_parts(limits)
        return keys, [
            _num(now),
            str(win.BUCKETS_PER_WINDOW),
            _num(win.SLOT_RETRY_AFTER_S),
            self._clock_flag,
            *limit_args,
        ]

    def _admit_parts(self, limits: Sequence[Limit]) -> tuple[list[str], list[str]]:
        """The KEYS of one admission and its 4 ARGV per key (``lua.ADMIT``)."""
        single_scope(lim.key for lim in limits)
        keys = [self._keys.limit(lim.key) for lim in limits]
        args: list[str] = []
        for lim in limits:
            args += _limit_args(lim)
        for i, lim in enumerate(limits):  # after the limits, so a refusal's index still names one of them
            if isinstance(lim, SlotLimit):
                for slot_id in lim.releasing:
                    keys.append(keys[i])
                    args += ["r", slot_id, "", ""]
        return keys, args

    @checks_own_cancellation
    async def settle(
        self,
        *,
        windows: Sequence[WindowLimit],
        slots: Sequence[SlotLimit],
        spend: dict[str, float],
        now: float,
        settle_id: str | None = None,
    ) -> None:
        settlement = Settlement(settle_id or "", tuple(windows), tuple(slots), tuple(spend.items()))
        await self.settle_many([settlement], now=now)

    @checks_own_cancellation
    async def settle_many(self, settlements: Sequence[Settlement], *, now: float) -> None:
        calls = _settle_calls(self._keys, settlements, now=now, clock_flag=self._clock_flag)
        if len(calls) == 1:
            await self._settle_riding(*calls[0])
        elif calls:
            await asyncio.gather(*(self._settle_riding(*call) for call in calls))

    async def _settle_riding(self, scope: str, keys: list[str], args: list[str]) -> None:
        task, before = cancelling_now()
        alone = functools.partial(self._settle, keys=keys, args=args)
        await self._rides.ride("settle", keys, args, scope, alone)
        raise_if_cancelled_since(task, before, "RedisStore.settle_many")

    async def _background(
        self, script: str, keys: list[str], args: list[str], alone: Callable[[], Awaitable[Any]]
    ) -> Any:
        """A read or write of a background loop on fleet-wide keys, riding on the next admit (one Redis only)."""
        return await self._rides.ride(script, keys, args, None, alone, wait_s=self._background_ride_s)

    async def _carry(self, riders: list[Rider], own: Sequence[_Call]) -> list[Any]:
        """Run ``riders`` and then the caller's ``own`` calls in one bundle script call; the replies of ``own``.
        The bundle is sent by a task of its own, so a caller cancelled meanwhile leaves the riders their replies."""
        keys, args = _bundle_call([(r.script, r.keys, r.args) for r in riders] + list(own))
        if riders:
            sending = asyncio.ensure_future(self._send_bundle(riders, keys, args))
            sending.add_done_callback(_retrieve)
            replies = await asyncio.shield(sending)
        else:
            replies = [as_error(reply) for reply in await self._bundle(keys=keys, args=args)]
        mine = replies[len(riders) :]
        failed = [reply for reply in mine if isinstance(reply, Exception)]
        if failed:
            raise failed[0]
        return mine

    async def _send_bundle(self, riders: list[Rider], keys: list[str], args: list[str]) -> list[Any]:
        """Send the bundle and hand each rider its reply; if anything fails before every rider has one (the call,
        or the replies not matching the calls), the riders still waiting get the failure, never silence."""
        try:
            replies = [as_error(reply) for reply in await self._bundle(keys=keys, args=args)]
            riding.deliver(riders, replies[: len(riders)])
        except Exception as exc:
            riding.fail(riders, exc)
            raise
        except BaseException:
            riding.fail(riders, RedisConnectionError("the call carrying this one was cancelled: it may have run"))
            raise
        return replies

    async def spent(self, key: str) -> float:
        value = await self._redis.get(self._keys.limit(key))
        return float(value) if value is not None else 0.0

    # worker state --------------------------------------------------------------------------------------
    async def publish_worker_state(self, state: WorkerState, *, ttl_s: float) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self._keys.worker_state_prefix() + state.worker_id, state.model_dump_json(), px=_ms(ttl_s))
            pipe.sadd(self._keys.workers(), state.worker_id)
            await pipe.execute()

    async def worker_states(self) -> dict[str, WorkerState]:
        keys, args = [self._keys.workers()], [self._keys.worker_state_prefix()]
        alone = functools.partial(self._worker_states, keys=keys, args=args)
        texts: list[str] = await self._background("worker_states", keys, args, alone)
        states = [WorkerState.model_validate_json(t) for t in texts]
        return {s.worker_id: s for s in states}

    # outlier ejection ----------------------------------------------------------------------------------
    async def eject(self, worker_id: str, *, until: float, reason: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.zadd(self._keys.ejected("until"), {worker_id: until})
            pipe.hset(self._keys.ejected("reason"), worker_id, reason)
            await pipe.execute()

    async def ejected(self, *, now: float) -> dict[str, float]:
        keys, args = [self._keys.ejected("until")], [_num(now)]
        alone = functools.partial(self._ejected, keys=keys, args=args)
        flat: list[str] = await self._background("ejected", keys, args, alone)
        return {worker_id: float(until) for worker_id, until in zip(flat[::2], flat[1::2], strict=True)}

    # leader lease --------------------------------------------------------------------------------------
    async def acquire_lease(self, name: str, holder: str, *, ttl_s: float) -> bool:
        return bool(await self._acquire(keys=[self._keys.lease(name)], args=[holder, str(_ms(ttl_s))]))

    async def release_lease(self, name: str, holder: str) -> None:
        await self._release(keys=[self._keys.lease(name)], args=[holder])

    async def lease_holder(self, name: str) -> str | None:
        holder = await self._redis.get(self._keys.lease(name))
        return None if holder is None else str(holder)

    # gateway replica registry --------------------------------------------------------------------------
    async def replica_heartbeat(self, replica_id: str, *, ttl_s: float, now: float) -> int:
        keys, args = [self._keys.replicas()], [_num(now), replica_id, _num(ttl_s), self._clock_flag]
        alone = functools.partial(self._heartbeat, keys=keys, args=args)
        return int(await self._background("replica_heartbeat", keys, args, alone))

    # usage ledger --------------------------------------------------------------------------------------
    @checks_own_cancellation
    async def append_usage(self, record: UsageRecord) -> None:
        await self.append_usage_many((record,))

    @checks_own_cancellation
    async def append_usage_many(self, records: Sequence[UsageRecord]) -> None:
        by_tenant: dict[str, list[UsageRecord]] = {}
        for r in records:
            by_tenant.setdefault(r.tenant, []).append(r)
        new = [t for t in by_tenant if t not in self._known_tenants]
        if new:
            task, before = cancelling_now()
            await self._redis.sadd(self._keys.ledger_tenants(), *new)
            raise_if_cancelled_since(task, before, "RedisStore.append_usage_many")
            self._known_tenants.update(new)
        await asyncio.gather(*(self._append_tenant(t, rs) for t, rs in by_tenant.items()))

    async def _append_tenant(self, tenant: str, records: Sequence[UsageRecord]) -> None:
        keys = [self._keys.ledger(tenant, part) for part in ("stream", "index", "rollup", "ids")]
        # spend counter name -> its KEYS index (1-based, as text): each record bills the lifetime counter and the
        # counters of the periods holding its ``at`` (fleet.budget_period)
        counters: dict[str, str] = {}
        ttls: list[str] = []  # ms, relative to the record's ``at``: Redis's clock need not be the caller's
        rows: list[str] = []
        for r in records:
            for counter in billed_counters(tenant, r.at):
                if counter.key not in counters:
                    keys.append(self._keys.limit(counter.key))
                    counters[counter.key] = str(len(keys))
                    ttls.append("" if counter.expire_at is None else str(math.ceil((counter.expire_at - r.at) * 1000)))
            rows += [r.request_id, _num(r.at), r.model_dump_json(), r.tenant]
            rows += [str(r.prompt_tokens), str(r.completion_tokens), _num(r.cost_usd)]
            rows.append(" ".join(counters[c.key] for c in billed_counters(tenant, r.at)))
        args = ["1" if self._wait_replicas else "", *self._rollup_args, *ttls, *rows]
        if not self._wait_replicas:  # a WAIT counts the writes of its own connection: such an append goes alone
            await self._rides.ride("append_usage", keys, args, tenant, functools.partial(self._append, keys, args))
            return
        acked = await self._append_pinned(keys, args)
        if acked < self._wait_replicas:
            raise NotReplicated(f"{acked} of {self._wait_replicas} replicas acknowledged the ledger write")

    async def _append_pinned(self, keys: list[str], args: list[str]) -> int:
        """Run the append script and ``WAIT`` on ONE connection (``WAIT`` counts only the writes of the connection
        it runs on; a pooled call could land on another one and acknowledge nothing) and return how many replicas
        acknowledged. On a cluster the pair goes to the node that holds the tenant's slot; when that fails (the slot
        moved, the node is gone) the append is retried through the cluster client, which follows the new topology,
        and 0 is returned: the write may not be replicated, so the caller spools and replays it."""
        task, before = cancelling_now()
        script = [len(keys), *keys, *args]
        wait = ("WAIT", self._wait_replicas, self._wait_ms)
        run = self._pinned_cluster if isinstance(self._redis, RedisCluster) else self._pinned_single
        replies = await run(keys[0], [("EVALSHA", self._append.sha, *script), wait])
        if isinstance(replies[0], NoScriptError):
            replies = await run(keys[0], [("EVAL", lua.APPEND_USAGE, *script), wait])
        raise_if_cancelled_since(task, before, "RedisStore.append_usage_many")
        failed = [r for r in replies if isinstance(r, Exception)]
        if not failed:
            return int(replies[1])
        if isinstance(self._redis, RedisCluster) and isinstance(failed[0], RedisError | OSError):
            await self._append(keys=keys, args=args)
            return 0
        raise failed[0]

    async def _pinned_single(self, _key: str, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        async with self._redis.pipeline(transaction=False) as pipe:  # one connection, in order
            for command in commands:
                pipe.execute_command(*command)
            return await pipe.execute(raise_on_error=False)

    async def _pinned_cluster(self, key: str, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        assert isinstance(self._redis, RedisCluster)
        node = self._redis.get_node_from_key(key)
        if node is None:
            return [RedisClusterException(f"no node holds {key!r}")] * len(commands)
        pending = [PipelineCommand(i, *command) for i, command in enumerate(commands)]
        await node.execute_pipeline(pending)  # one connection of that node, in order; errors land in .result
        return [c.result for c in pending]

    async def usage(self, tenant: str, *, since: float, until: float, limit: int = 1000) -> UsageTotals:
        keys = [self._keys.ledger(tenant, "index"), self._keys.ledger(tenant, "rollup")]
        args = [_num(since), _num(until), str(max(limit, 0))] + [_num(size) for size in ROLLUP_SIZES_S]
        count, prompt, completion, cost, texts = await self._usage(keys=keys, args=args)
        return UsageTotals(
            requests=int(count),
            prompt_tokens=int(prompt),
            completion_tokens=int(completion),
            cost_usd=float(cost),
            records=tuple(UsageRecord.model_validate_json(t) for t in texts),
        )

    async def ledger(self, *, since: float, until: float, limit: int = 1000) -> list[UsageRecord]:
        limit = max(limit, 0)
        tenants = cast(set[str], await self._redis.smembers(self._keys.ledger_tenants()))
        lo, hi = _num(since), "(" + _num(until)
        indexes = [self._keys.ledger(t, "index") for t in sorted(tenants)]
        parts = cast(
            list[list[str]],
            await asyncio.gather(*(self._redis.zrangebyscore(key, lo, hi, start=0, num=limit) for key in indexes)),
        )
        merged = heapq.merge(*parts, key=record_order)
        return [UsageRecord.model_validate_json(text) for text in islice(merged, limit)]

    async def usage_tenants(self) -> list[str]:
        return sorted(cast(set[str], await self._redis.smembers(self._keys.ledger_tenants())))

    async def ledger_cutoff(self, tenant: str, *, keep: int) -> float | None:
        if keep <= 0:
            raise ValueError("keep must be positive")
        oldest_kept = await self._redis.zrange(self._keys.ledger(tenant, "index"), -keep, -keep, withscores=True)
        if not oldest_kept or await self._redis.zcard(self._keys.ledger(tenant, "index")) <= keep:
            return None
        return float(oldest_kept[0][1])

    async def trim_usage(self, tenant: str, *, before: float, expected: int) -> int | None:
        keys = [self._keys.ledger(tenant, part) for part in ("stream", "index", "rollup", "ids")]
        removed = int(await self._trim(keys=keys, args=[_num(before), str(expected), *self._rollup_args[1:]]))
        return None if removed < 0 else removed

    async def ledger_stream_length(self, tenant: str) -> int:
        """Entries in the tenant's append-only stream (what retention bounds, with the index)."""
        return int(await self._redis.xlen(self._keys.ledger(tenant, "stream")))

    # API keys ------------------------------------------------------------------------------------------
    async def put_api_key(self, record: ApiKeyRecord) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._keys.api_keys("digest"), record.digest, record.model_dump_json())
            pipe.hset(self._keys.api_keys("id"), record.key_id, record.digest)
            await pipe.execute()

    async def api_key_by_digest(self, digest: str) -> ApiKeyRecord | None:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hget(self._keys.api_keys("digest"), digest)
            pipe.sismember(self._keys.api_keys("revoked"), digest)
            text, revoked = await pipe.execute()
        return None if text is None else key_record(text, revoked=bool(revoked))

    async def api_keys(self, tenant: str | None = None) -> list[ApiKeyRecord]:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._keys.api_keys("digest"))
            pipe.smembers(self._keys.api_keys("revoked"))
            by_digest, revoked = await pipe.execute()
        records = [key_record(text, revoked=digest in revoked) for digest, text in by_digest.items()]
        return sort_keys(records, tenant)

    async def revoke_api_key(self, key_id: str) -> bool:
        keys = [self._keys.api_keys("id"), self._keys.api_keys("revoked")]
        return bool(await self._revoke(keys=keys, args=[key_id]))

    # lifecycle -----------------------------------------------------------------------------------------
    # shared documents and logs -------------------------------------------------------------------------
    async def put_doc(self, collection: str, doc_id: str, body: str, *, ttl_s: float | None = None) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self._keys.doc_prefix(collection) + doc_id, body, px=None if ttl_s is None else _ms(ttl_s))
            pipe.sadd(self._keys.doc_ids(collection), doc_id)
            await pipe.execute()

    async def get_doc(self, collection: str, doc_id: str) -> str | None:
        text = await self._redis.get(self._keys.doc_prefix(collection) + doc_id)
        return None if text is None else str(text)

    async def docs(self, collection: str) -> dict[str, str]:
        keys, args = [self._keys.doc_ids(collection)], [self._keys.doc_prefix(collection)]
        alone = functools.partial(self._docs, keys=keys, args=args)
        flat: list[str] = await self._background("docs", keys, args, alone)
        return dict(zip(flat[::2], flat[1::2], strict=True))

    async def delete_doc(self, collection: str, doc_id: str) -> bool:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._keys.doc_prefix(collection) + doc_id)
            pipe.srem(self._keys.doc_ids(collection), doc_id)
            deleted, _ = await pipe.execute()
        return bool(deleted)

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
        log_collection(log, collection)
        keys = [self._keys.doc_prefix(collection) + doc_id, self._keys.doc_ids(collection), self._keys.log(log)]
        member = f"{uuid.uuid4().hex}:{entry}"
        args = ["" if body is None else "1", body or "", doc_id, member, _num(now), str(LOG_MAX_ENTRIES)]
        args.append("" if expect_version is None else str(expect_version))
        written, found = await self._put_doc_logged(keys=keys, args=args)
        if not int(written):
            assert expect_version is not None
            raise DocVersionConflict(int(found), expect_version)

    async def append_log(self, log: str, body: str, *, now: float) -> None:
        # A sorted set by time; the member carries a unique prefix so equal bodies at equal times both stay.
        member = f"{uuid.uuid4().hex}:{body}"
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.zadd(self._keys.log(log), {member: now})
            pipe.zremrangebyrank(self._keys.log(log), 0, -(LOG_MAX_ENTRIES + 1))
            await pipe.execute()

    async def read_log(self, log: str, *, since: float, until: float, limit: int = 1000) -> list[LogEntry]:
        if limit <= 0:
            return []
        legacy = self._keys.legacy_log(log)
        names = [self._keys.log(log), *([legacy] if legacy else [])]
        lo, hi = _num(since), f"({_num(until)}"
        parts = await asyncio.gather(
            *(self._redis.zrangebyscore(n, lo, hi, start=0, num=limit, withscores=True) for n in names)
        )
        pairs = cast(list[tuple[str, float]], heapq.merge(*parts, key=lambda pair: (pair[1], pair[0])))
        return [LogEntry(at=float(at), body=str(member).partition(":")[2]) for member, at in islice(pairs, limit)]

    async def verify(self) -> None:
        try:
            if isinstance(self._redis, RedisCluster):
                await self._redis.initialize()
                await self._check_schema()
                return
            info = await self._redis.info("cluster")
        except RedisClusterException as exc:
            if "not enabled" in str(exc).lower():
                raise StoreMisconfigured(
                    "GEARSHIFT_REDIS_CLUSTER=true but GEARSHIFT_REDIS_URL is not a Redis Cluster node "
                    f"({exc}): unset GEARSHIFT_REDIS_CLUSTER or point at a cluster"
                ) from None
            return  # unreachable: the failure mode handles outages
        except (RedisError, OSError):
            return
        if int(info.get("cluster_enabled", 0)):
            raise StoreMisconfigured(
                "GEARSHIFT_REDIS_URL is a Redis Cluster node: set GEARSHIFT_REDIS_CLUSTER=true "
                "(a plain client would fail every call that lands on another node)"
            )
        await self._check_schema()

    async def _check_schema(self) -> None:
        """Claim the prefix for this ``SCHEMA_VERSION`` if it has none; refuse a newer one; upgrade an older one
        (no layout before version 1 needs a step). An unreachable store passes (the failure mode handles it)."""
        key = self._keys.schema()
        try:
            await self._redis.set(key, str(SCHEMA_VERSION), nx=True)
            found = int(await self._redis.get(key) or SCHEMA_VERSION)
            if found < SCHEMA_VERSION:
                await self._redis.set(key, str(SCHEMA_VERSION))
        except (RedisError, OSError):
            return
        if found > SCHEMA_VERSION:
            raise StoreMisconfigured(
                f"the store under prefix {self._keys.prefix!r} has schema version {found}, newer than this "
                f"gearshift's {SCHEMA_VERSION}: a newer gearshift wrote it. Upgrade this process (gateways and "
                "controllers may run one minor version apart only if they share a schema version), or give it "
                "another GEARSHIFT_KEY_PREFIX"
            )

    async def ping(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except (RedisError, OSError):
            return False

    async def close(self) -> None:
        if self._fast is not None:
            await self._fast.close()
        await self._redis.aclose()
        if self._sentinel is not None:
            for client in self._sentinel.sentinels:
                await client.aclose()
