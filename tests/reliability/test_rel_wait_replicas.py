"""Defect 5 (issue 23): ``GEARSHIFT_REDIS_WAIT_REPLICAS`` must never acknowledge a ledger write that no replica
has. Redis's ``WAIT`` counts only the writes of the connection it runs on, so it must run on the connection that
wrote, and a replayed append that writes nothing new must still wait for what is already there.

Real replicas on loopback, frozen with SIGSTOP (still connected, acknowledging nothing): every append must fail
with ``NotReplicated`` until they are thawed. Before the fix, on Redis Cluster (whose per-node pool hands out its
oldest free connection) most appends were acknowledged by a ``WAIT`` on a connection whose last, older write had
long been replicated."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from redis.asyncio import Redis

from bench.procs import Proc, start_redis_cluster
from fleet.store.protocol import UsageRecord
from fleet.store.redis import NotReplicated, RedisStore

from .rel_types import StartRedis

pytestmark = pytest.mark.redis

TENANTS = 4
APPENDS = 8


async def eventually(check: Callable[[], Awaitable[bool]], *, timeout_s: float) -> None:
    """Poll ``check`` every 50 ms until true; fail after ``timeout_s`` seconds (this module stays off the
    gateway, so it does not use ``rel_harness``)."""
    for _ in range(int(timeout_s / 0.05) + 1):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout_s} s")


def _record(tenant: str, request_id: str) -> UsageRecord:
    return UsageRecord(
        request_id=request_id, tenant=tenant, model="m", worker_id=None, prompt_tokens=3, completion_tokens=5,
        cost_usd=0.01, status="ok", at=time.time(),
    )  # fmt: skip


async def _acknowledged(store: RedisStore, record: UsageRecord) -> bool:
    try:
        await store.append_usage(record)
    except NotReplicated:
        return False
    return True


async def _frozen_appends(store: RedisStore, replicas: list[Proc]) -> None:
    """Warm the pool with replicated writes, freeze ``replicas``, then check that no append, new or replayed,
    is acknowledged until they are thawed, and that a replay is acknowledged once they are."""
    warm = [_record(f"t{i % TENANTS}", f"w{i}") for i in range(4 * TENANTS)]
    await asyncio.gather(*(store.append_usage(r) for r in warm), return_exceptions=True)
    for r in warm:  # in sync, every one is acknowledged (a replay, when a busy machine made a WAIT time out)
        await eventually(functools.partial(_acknowledged, store, r), timeout_s=15.0)
    for proc in replicas:
        proc.pause()
    try:
        records = [_record(f"t{i % TENANTS}", f"r{i}") for i in range(APPENDS)]
        outcomes: list[str] = []
        for r in records:  # one after another: no interleaving is needed to get a wrong connection
            try:
                await store.append_usage(r)
                outcomes.append("acknowledged")
            except NotReplicated:
                outcomes.append("not replicated")
        assert outcomes == ["not replicated"] * APPENDS
        # the gateway's spool replays them: already in the ledger, so nothing new is written, yet not replicated
        with pytest.raises(NotReplicated):
            await store.append_usage(records[0])
    finally:
        for proc in replicas:
            proc.resume()

    # the replicas caught up: the replay is acknowledged
    await eventually(functools.partial(_acknowledged, store, records[0]), timeout_s=15.0)
    assert (await store.usage("t0", since=0, until=time.time() + 60)).requests == 4 + APPENDS // TENANTS


async def test_no_false_acknowledgement_on_a_redis_cluster(tmp_path: Path) -> None:
    cluster = await asyncio.to_thread(start_redis_cluster, log_dir=tmp_path)
    prefix = f"wait-{uuid.uuid4().hex[:8]}:"
    store = RedisStore.from_url(cluster.url, prefix=prefix, cluster=True, wait_replicas=1)
    try:
        await store.verify()
        await _frozen_appends(store, cluster.nodes[3:])  # masters first, then the replicas
    finally:
        await store.close()
        cluster.stop()


async def _replica_of(primary: Proc, own_redis: StartRedis) -> Proc:
    replica = own_redis(persist=False)
    client = Redis.from_url(replica.url)
    try:
        await client.execute_command("REPLICAOF", "127.0.0.1", str(primary.port))

        async def synced() -> bool:
            return bool((await client.info("replication")).get("master_link_status") == "up")

        await eventually(synced, timeout_s=15.0)
    finally:
        await client.aclose()
    return replica


async def test_no_false_acknowledgement_on_a_primary_with_a_replica(own_redis: StartRedis) -> None:
    primary = own_redis(persist=False)
    replica = await _replica_of(primary, own_redis)
    store = RedisStore.from_url(primary.url, prefix=f"wait-{uuid.uuid4().hex[:8]}:", wait_replicas=1)
    try:
        await _frozen_appends(store, [replica])
    finally:
        await store.close()
