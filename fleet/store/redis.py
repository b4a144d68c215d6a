"""``RedisStore``: the ``Store`` on a real Redis (redis-py's asyncio client), shared by gateway replicas and
controllers. Every key starts with the configured prefix (``gearshift:`` by default).

Why hand-written Lua rather than the ``limits`` library: ``limits`` checks and hits one limit at a time,
with its own clock, and has no way to refund part of a hit. The gateway needs every limit of a request
(requests per minute, tokens per minute, concurrency, budget) checked and reserved all-or-nothing in one
round trip, with ``now`` injected (virtual-time tests) and token reservations reconciled afterwards. So
``admit`` and ``settle`` are single Lua scripts (EVALSHA, falling back to EVAL when Redis lost its script cache,
for example after a restart) running the rolling-
window math of ``fleet.store.window``, which ``MemoryStore`` runs in Python: the two agree exactly.

Key layout (``P`` is the prefix):

- ``P<limit key>``: window counter (hash bucket → units), slot set (sorted set slot id → expiry, Unix s),
  or spend counter (string, USD), under the key the caller gives in the limit.
- ``Pworker:<id>`` (string, JSON, Redis TTL) and ``Pworkers`` (set of ids, pruned on read).
- ``Pejected`` (sorted set id → until) and ``Pejected:reason`` (hash id → reason).
- ``Please:<name>`` (string holder, Redis TTL).
- ``Pusage`` (stream: the append-only ledger, one entry per record, fields ``tenant`` and ``record``) and
  ``Pusage:tenant:<tenant>`` (sorted set at → record JSON: the per-tenant index that ``usage`` reads by time)
  and ``Pusage:rollup:<tenant>`` (hash of hourly and per-minute totals, see ``fleet.store.ledger``): ``usage``
  sums whole hours and minutes from the roll-ups and at most two minutes of single records, and returns at
  most ``limit`` records.
- ``Papikey:digest`` (hash digest → record JSON), ``Papikey:id`` (hash key id → digest), ``Papikey:revoked``
  (set of digests).

The scripts touch keys derived from their arguments, so this store wants a single Redis (or a primary with
replicas and Sentinel), not Redis Cluster.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fleet.store import lua
from fleet.store import window as win
from fleet.store.cancel import cancellation_safe, cancelling_now, checks_own_cancellation, raise_if_cancelled_since
from fleet.store.ledger import ROLLUP_SIZES_S
from fleet.store.memory import key_record, sort_keys
from fleet.store.protocol import (
    Admission,
    ApiKeyRecord,
    BudgetLimit,
    Limit,
    SlotLimit,
    UsageRecord,
    UsageTotals,
    WindowLimit,
    WorkerState,
)

DEFAULT_PREFIX = "gearshift:"
_RETRIES = 1
"""Retries of a call whose connection failed (each on a fresh connection)."""


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
    return ["b", _num(lim.limit_usd), "", ""]


class _Script:
    """One Lua script, run with EVALSHA (EVAL, which also caches it, when Redis answers NOSCRIPT).

    Cheaper than redis-py's ``AsyncScript`` on the hot path (no per-call type checks), and it carries the
    dropped-cancellation check of ``fleet.store.cancel`` itself so the hot methods need no wrapper."""

    __slots__ = ("_execute", "_name", "_sha", "_text")

    def __init__(self, client: Redis, text: str, name: str) -> None:
        self._execute: Callable[..., Awaitable[Any]] = client.execute_command
        self._text = text
        self._sha = hashlib.sha1(text.encode()).hexdigest()
        self._name = name

    async def __call__(self, keys: Sequence[str], args: Sequence[str]) -> Any:
        task, before = cancelling_now()
        try:
            reply = await self._execute("EVALSHA", self._sha, len(keys), *keys, *args)
        except NoScriptError:
            reply = await self._execute("EVAL", self._text, len(keys), *keys, *args)
        raise_if_cancelled_since(task, before, self._name)
        return reply


@cancellation_safe
class RedisStore:
    """``Store`` on Redis. Owns ``client`` (``close`` closes it); build one with ``from_url``."""

    def __init__(self, client: Redis, *, prefix: str = DEFAULT_PREFIX) -> None:
        self._redis = client
        self._prefix = prefix
        self._admit = _Script(client, lua.ADMIT, "RedisStore.admit")
        self._settle = _Script(client, lua.SETTLE, "RedisStore.settle")
        self._worker_states = _Script(client, lua.WORKER_STATES, "RedisStore.worker_states")
        self._acquire = _Script(client, lua.ACQUIRE_LEASE, "RedisStore.acquire_lease")
        self._release = _Script(client, lua.RELEASE_LEASE, "RedisStore.release_lease")
        self._append = _Script(client, lua.APPEND_USAGE, "RedisStore.append_usage_many")
        self._usage = _Script(client, lua.USAGE, "RedisStore.usage")
        self._revoke = _Script(client, lua.REVOKE_KEY, "RedisStore.revoke_api_key")
        self._rollup_args = [str(len(ROLLUP_SIZES_S))] + [_num(size) for size in ROLLUP_SIZES_S]

    @classmethod
    def from_url(
        cls, url: str, *, prefix: str = DEFAULT_PREFIX, max_connections: int = 512, wait_s: float = 5.0
    ) -> RedisStore:
        """A store on a new pool of at most ``max_connections`` connections to ``url`` (``redis://host:port/db``);
        opening a connection gives up after ``wait_s`` seconds. The pool is redis-py's plain ``ConnectionPool``:
        its ``BlockingConnectionPool`` cost the gateway a lock and a condition wait on every call, which showed
        at 64 concurrent requests; the cap is far above a gateway's concurrent store calls, so it is never hit.

        A connection that fails (for example one left idle across a Redis restart) is reconnected and the call
        retried once after a short back-off, so a restart costs no caller an error once Redis is back."""
        pool = ConnectionPool.from_url(
            url,
            max_connections=max_connections,
            socket_connect_timeout=wait_s,
            decode_responses=True,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), _RETRIES),
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
        )
        return cls(Redis.from_pool(pool), prefix=prefix)

    def _k(self, name: str) -> str:
        return self._prefix + name

    # limits -------------------------------------------------------------------------------------------
    @checks_own_cancellation
    async def admit(self, limits: Sequence[Limit], *, now: float) -> Admission:
        if not limits:
            return Admission(allowed=True)
        args = [_num(now), str(win.BUCKETS_PER_WINDOW), _num(win.SLOT_RETRY_AFTER_S)]
        for lim in limits:
            args += _limit_args(lim)
        reply: list[Any] = await self._admit(keys=[self._k(lim.key) for lim in limits], args=args)
        if int(reply[0]) == 1:
            return Admission(allowed=True)
        return Admission(allowed=False, tripped=limits[int(reply[1]) - 1].key, retry_after_s=float(reply[2]))

    @checks_own_cancellation
    async def settle(
        self,
        *,
        windows: Sequence[WindowLimit],
        slots: Sequence[SlotLimit],
        spend: dict[str, float],
        now: float,
    ) -> None:
        windows = [w for w in windows if w.cost != 0]
        if not (windows or slots or spend):
            return
        keys = [self._k(w.key) for w in windows] + [self._k(s.key) for s in slots] + [self._k(k) for k in spend]
        args = [_num(now), str(win.BUCKETS_PER_WINDOW), str(len(windows)), str(len(slots))]
        for w in windows:
            args += [str(w.cost), _num(w.window_s), "" if w.reserved_at is None else _num(w.reserved_at)]
        args += [s.slot_id for s in slots]
        args += [_num(usd) for usd in spend.values()]
        await self._settle(keys=keys, args=args)

    async def spent(self, key: str) -> float:
        value = await self._redis.get(self._k(key))
        return float(value) if value is not None else 0.0

    # worker state --------------------------------------------------------------------------------------
    async def publish_worker_state(self, state: WorkerState, *, ttl_s: float) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self._k(f"worker:{state.worker_id}"), state.model_dump_json(), px=_ms(ttl_s))
            pipe.sadd(self._k("workers"), state.worker_id)
            await pipe.execute()

    async def worker_states(self) -> dict[str, WorkerState]:
        texts: list[str] = await self._worker_states(keys=[self._k("workers")], args=[self._k("worker:")])
        states = [WorkerState.model_validate_json(t) for t in texts]
        return {s.worker_id: s for s in states}

    # outlier ejection ----------------------------------------------------------------------------------
    async def eject(self, worker_id: str, *, until: float, reason: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.zadd(self._k("ejected"), {worker_id: until})
            pipe.hset(self._k("ejected:reason"), worker_id, reason)
            await pipe.execute()

    async def ejected(self, *, now: float) -> dict[str, float]:
        key = self._k("ejected")
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.zremrangebyscore(key, "-inf", _num(now))
            pipe.zrange(key, 0, -1, withscores=True)
            _, pairs = await pipe.execute()
        return {worker_id: float(until) for worker_id, until in pairs}

    # leader lease --------------------------------------------------------------------------------------
    async def acquire_lease(self, name: str, holder: str, *, ttl_s: float) -> bool:
        return bool(await self._acquire(keys=[self._k(f"lease:{name}")], args=[holder, str(_ms(ttl_s))]))

    async def release_lease(self, name: str, holder: str) -> None:
        await self._release(keys=[self._k(f"lease:{name}")], args=[holder])

    async def lease_holder(self, name: str) -> str | None:
        holder = await self._redis.get(self._k(f"lease:{name}"))
        return None if holder is None else str(holder)

    # usage ledger --------------------------------------------------------------------------------------
    @checks_own_cancellation
    async def append_usage(self, record: UsageRecord) -> None:
        await self.append_usage_many((record,))

    @checks_own_cancellation
    async def append_usage_many(self, records: Sequence[UsageRecord]) -> None:
        if not records:
            return
        keys, args = [self._k("usage")], list(self._rollup_args)
        for r in records:
            keys += [self._k(f"usage:tenant:{r.tenant}"), self._k(f"usage:rollup:{r.tenant}")]
            args += [_num(r.at), r.model_dump_json(), r.tenant]
            args += [str(r.prompt_tokens), str(r.completion_tokens), _num(r.cost_usd)]
        await self._append(keys=keys, args=args)

    async def usage(self, tenant: str, *, since: float, until: float, limit: int = 1000) -> UsageTotals:
        keys = [self._k(f"usage:tenant:{tenant}"), self._k(f"usage:rollup:{tenant}")]
        args = [_num(since), _num(until), str(max(limit, 0))] + [_num(size) for size in ROLLUP_SIZES_S]
        count, prompt, completion, cost, texts = await self._usage(keys=keys, args=args)
        return UsageTotals(
            requests=int(count),
            prompt_tokens=int(prompt),
            completion_tokens=int(completion),
            cost_usd=float(cost),
            records=tuple(UsageRecord.model_validate_json(t) for t in texts),
        )

    # API keys ------------------------------------------------------------------------------------------
    async def put_api_key(self, record: ApiKeyRecord) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._k("apikey:digest"), record.digest, record.model_dump_json())
            pipe.hset(self._k("apikey:id"), record.key_id, record.digest)
            await pipe.execute()

    async def api_key_by_digest(self, digest: str) -> ApiKeyRecord | None:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hget(self._k("apikey:digest"), digest)
            pipe.sismember(self._k("apikey:revoked"), digest)
            text, revoked = await pipe.execute()
        return None if text is None else key_record(text, revoked=bool(revoked))

    async def api_keys(self, tenant: str | None = None) -> list[ApiKeyRecord]:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._k("apikey:digest"))
            pipe.smembers(self._k("apikey:revoked"))
            by_digest, revoked = await pipe.execute()
        records = [key_record(text, revoked=digest in revoked) for digest, text in by_digest.items()]
        return sort_keys(records, tenant)

    async def revoke_api_key(self, key_id: str) -> bool:
        keys = [self._k("apikey:id"), self._k("apikey:revoked")]
        return bool(await self._revoke(keys=keys, args=[key_id]))

    # lifecycle -----------------------------------------------------------------------------------------
    async def ping(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except (RedisError, OSError):
            return False

    async def close(self) -> None:
        await self._redis.aclose()
