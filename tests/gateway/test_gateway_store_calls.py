"""Store calls per request on the gateway's hot path (issue 26): a sequential client of a tenant under leases costs
one store call per request (its exact concurrency admit) and none where leases cover every limit; its slot releases
ride on its next admits and its usage records share one ledger write per linger.

The unit tests count the calls of a memory store through the admitter and the ledger writer, with a clock that holds
the writers' linger until the test lets go, so the counts are exact. The Redis test counts the scripts and
transactions a real Redis ran (``INFO commandstats``) while a real gateway served sequential requests."""

from __future__ import annotations

import asyncio
import collections
import math
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from bench.gateway.commands import redis_commands
from fleet.clock import ManualClock
from fleet.config import TenantConfig
from fleet.store.memory import MemoryStore
from fleet.store.protocol import Admission, Limit, Settlement, SlotLimit, UsageRecord
from fleet.store.redis import RedisStore
from gateway.intake.admission import Admitter
from gateway.intake.leases import LeaseBook
from gateway.usage.metering import LedgerWriter
from gateway.usage.metrics import GatewayMetrics

from .harness import MODEL, StartUpstreams, make_fleet, make_tenants, serve_gateway


class HeldClock(ManualClock):
    """Time stands still and ``sleep`` returns only once the test lets go (``go``): the writers' linger holds."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        await self.go.wait()


class CountingStore(MemoryStore):
    """A memory store that counts its calls by method (each one a round trip on Redis) and the slots it released."""

    def __init__(self, *, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.calls: collections.Counter[str] = collections.Counter()
        self.released_by_settle = 0

    async def admit(self, limits: Sequence[Limit], *, now: float) -> Admission:
        self.calls["admit"] += 1
        return await super().admit(limits, now=now)

    async def admit_many(self, calls: Sequence[tuple[Sequence[Limit], float]]) -> list[Admission]:
        self.calls["admit_many"] += 1
        return [await MemoryStore.admit(self, limits, now=now) for limits, now in calls]

    async def settle_many(self, settlements: Sequence[Settlement], *, now: float) -> None:
        self.calls["settle_many"] += 1
        self.released_by_settle += sum(len(s.slots) for s in settlements)
        await super().settle_many(settlements, now=now)

    async def append_usage_many(self, records: Sequence[UsageRecord]) -> None:
        self.calls["append_usage_many"] += 1
        await super().append_usage_many(records)


def record(request_id: str, tenant: str, at: float) -> UsageRecord:
    return UsageRecord(request_id=request_id, tenant=tenant, model=MODEL, worker_id="w0", prompt_tokens=10,
                       completion_tokens=5, cost_usd=0.001, status="ok", at=at)  # fmt: skip


async def serve_sequentially(tenant: TenantConfig, n: int) -> tuple[CountingStore, int, HeldClock]:
    """``n`` requests of ``tenant`` one after another through the admitter and the ledger writer, as the pipeline
    makes them; returns the store and how many store calls they made before the writers' linger ended."""
    clock = HeldClock()
    store = CountingStore(clock=clock)
    metrics = GatewayMetrics()
    leases = LeaseBook(store, clock, share=lambda: 1.0)
    admitter = Admitter(store, clock=clock, metrics=metrics, leases=leases, batch=True)
    writer = LedgerWriter(store, clock=clock, metrics=metrics, usage_landed=admitter.usage_landed,
                          settle_landed=admitter.settle_landed, ledger_linger_s=0.02, settle_linger_s=0.01,
                          unsettled=admitter.unsettled)  # fmt: skip
    writer.start()

    async def serve(request_id: str) -> None:
        ticket = await admitter.admit(tenant, request_id=request_id, tokens=20)
        settlement = await admitter.finish(ticket, used_tokens=15, cost_usd=0.001)
        writer.write(record(request_id, tenant.id, clock.wall()), settlement)

    clock.go.set()  # a first request, the leases granted and everything written: then count
    await serve("first")
    await leases.idle()
    await writer.idle()
    clock.go.clear()
    store.calls.clear()
    store.released_by_settle = 0
    for i in range(n):
        await serve(f"r{i}")
    before_linger = sum(store.calls.values())
    clock.go.set()
    await writer.idle()
    await writer.close()
    return store, before_linger, clock


N = 50


async def test_a_concurrency_limited_tenant_costs_one_admit_per_request_and_its_releases_ride_on_them() -> None:
    tenant = TenantConfig(id="acme", tier="standard", rpm=1_000_000, tpm=1_000_000_000, budget_usd=1_000.0,
                          max_concurrency=4)  # fmt: skip
    store, before_linger, clock = await serve_sequentially(tenant, N)
    admits = store.calls["admit"] + store.calls["admit_many"]
    assert admits == N  # one per request: its concurrency slot, exact (time stands still: no lease renewed)
    assert before_linger == admits  # nothing else while the client was being served
    # after the linger: one settlement write, for the last slot only (each earlier one rode on the next admit), and
    # one ledger write for all the records
    assert store.calls["settle_many"] == 1
    assert store.released_by_settle == 1
    assert store.calls["append_usage_many"] == 1
    assert (await store.usage("acme", since=0, until=math.inf)).requests == N + 1
    # no slot is left held: a limit of one admits a new one
    fresh = SlotLimit(key="concurrency:acme", slot_id="probe", limit=1)
    assert (await MemoryStore.admit(store, [fresh], now=clock.wall())).allowed


async def test_a_tenant_under_leases_alone_costs_no_store_call_per_request() -> None:
    tenant = TenantConfig(id="acme", tier="standard", rpm=1_000_000, tpm=1_000_000_000, budget_usd=1_000.0)
    store, before_linger, _ = await serve_sequentially(tenant, N)
    assert before_linger == 0  # the leases serve every limit
    assert store.calls["settle_many"] == 0  # TPM corrections go to the lease, no slot to release
    assert store.calls["append_usage_many"] == 1


async def redis_round_trips(url: str) -> int:
    """The gateway's calls to the Redis at ``url`` so far (``bench.gateway.commands.redis_commands``)."""
    return await asyncio.to_thread(redis_commands, url)


@pytest.mark.redis
async def test_redis_runs_at_most_one_command_per_request_of_a_sequential_client(
    redis_url: str, upstreams: StartUpstreams
) -> None:
    (w,) = await upstreams(1)
    limits = {"rpm": 1_000_000, "tpm": 1_000_000_000, "budget_usd": 1_000.0}
    tenants = make_tenants(alpha={**limits, "max_concurrency": 8}, beta=limits)
    store = RedisStore.from_url(redis_url, prefix=f"gs-test-{uuid.uuid4().hex[:8]}:")
    quiet: dict[str, Any] = {"state_refresh_s": 600, "tenants_refresh_s": 600, "replica_heartbeat_s": 600,
                             "health_interval_s": 600, "health_timeout_s": 1, "ledger_linger_s": 1.0,
                             "settle_linger_s": 1.0}  # fmt: skip
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        async with serve_gateway(make_fleet([w.url]), tenants, store=store, **quiet) as gw:
            for tenant in ("alpha", "beta"):
                async with gw.client(tenant) as client:
                    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200  # leases
                    await gw.gw.ledger.idle()
                    start, started_at = await redis_round_trips(redis_url), time.monotonic()
                    for _ in range(N):
                        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
                    served = await redis_round_trips(redis_url) - start
                    elapsed_s = time.monotonic() - started_at
                    await gw.gw.ledger.idle()
                    total = await redis_round_trips(redis_url) - start
                # per second at most: the budget's spend read (fresh for 2 s, read at half of it), the RPM and TPM
                # leases renewed (each 2 s: a grant and a return), and each lingering writer's one write
                background = 5 * (math.ceil(elapsed_s) + 1)
                per_request = 1 if tenant == "alpha" else 0  # the exact concurrency admit; beta has none
                assert served <= N * per_request + background, (tenant, served, elapsed_s)
                assert total <= N * per_request + background, (tenant, total, elapsed_s)
    finally:
        await store.close()


async def test_a_budget_rides_on_the_admits_a_request_makes_anyway() -> None:
    clock = ManualClock()
    store = CountingStore(clock=clock)
    leases = LeaseBook(store, clock, share=lambda: 1.0)
    admitter = Admitter(store, clock=clock, metrics=GatewayMetrics(), leases=leases)
    tenant = TenantConfig(id="acme", tier="standard", budget_usd=1_000.0, max_concurrency=4)
    for i in range(N):
        ticket = await admitter.admit(tenant, request_id=f"r{i}", tokens=20)
        await leases.idle()
        await admitter.finish(ticket, used_tokens=15, cost_usd=0.001)
        clock.advance(1.0)  # past half the budget lease's 2 s each time: a lease alone would read the spend again
    assert store.calls["admit"] == N  # the slot admits, each checking the budget too: no spend reads of their own


@pytest.mark.redis
async def test_with_every_loop_at_work_redis_runs_one_command_per_request_of_a_sequential_client(
    redis_url: str, upstreams: StartUpstreams
) -> None:
    """Issue 26's criterion at c=1, the background at work (worker states, ejections, modes, plans and tenants re-read
    every 50 ms, heartbeats every 0.2 s, leases renewed every 0.1 s): Redis runs no more scripts and transactions than
    the client makes requests, each request's exact concurrency admit carrying everything else
    (``fleet.store.rides``; the riders wait up to 2 s here, so a slow machine changes no count)."""
    (w,) = await upstreams(1)
    limits = {"rpm": 1_000_000, "tpm": 1_000_000_000, "budget_usd": 1_000.0, "max_concurrency": 8}
    store = RedisStore.from_url(redis_url, prefix=f"gs-test-{uuid.uuid4().hex[:8]}:", ride_s=2.0)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    n, warm = 4 * N, 10
    try:
        async with serve_gateway(make_fleet([w.url]), make_tenants(alpha=limits), store=store, lease_ttl_s=0.1,
                                 replica_heartbeat_s=0.2) as gw:  # fmt: skip
            async with gw.client("alpha") as client:
                for _ in range(warm):
                    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
                start = await redis_round_trips(redis_url)
                for _ in range(n):
                    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
                served = await redis_round_trips(redis_url) - start
            await gw.gw.ledger.idle()
            ledger = await store.usage("alpha", since=0, until=math.inf)
    finally:
        await store.close()
    assert served <= n, served
    assert ledger.requests == warm + n  # every record landed, once
