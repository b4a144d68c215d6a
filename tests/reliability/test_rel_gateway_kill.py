"""The store stops under load, then the gateway is killed with SIGKILL and restarted on its spool: once the store
is back, the ledger holds every request the clients saw answered, exactly once (the spool survived the kill)."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.procs import Proc, start_gateway, start_redis
from bench.soak.client import StreamResult, stream_chat
from fleet.store.redis import RedisStore
from gateway.usage.metrics import LEDGER_BACKLOG
from tests.gateway.harness import eventually

from .rel_harness import KEYS, chat, fleet_of, tenants_of, write_env
from .rel_types import StartRedis, StartSims

pytestmark = pytest.mark.redis

MAX_REQUESTS = 400
"""Bound on the requests the clients send in all."""


async def _traffic(url: str, stop: asyncio.Event, out: list[tuple[float, StreamResult]]) -> None:
    """Four clients streaming back to back until ``stop`` (at most ``MAX_REQUESTS`` in all)."""
    async with aiohttp.ClientSession() as s:

        async def client() -> None:
            while not stop.is_set() and len(out) < MAX_REQUESTS:
                r = await stream_chat(s, url, key=KEYS["alpha"], body=chat(3), timeout_s=10)
                out.append((time.monotonic(), r))

        await asyncio.gather(*(client() for _ in range(4)))


async def _no_backlog(url: str) -> bool:
    """True when the gateway's ``gearshift_gateway_ledger_backlog`` (records and settlements neither stored nor
    spooled) is 0."""
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as resp:
        text = await resp.text()
    family = next(f for f in text_string_to_metric_families(text) if f.name == LEDGER_BACKLOG)
    return family.samples[0].value == 0.0


async def test_a_gateway_killed_during_a_store_outage_bills_every_answered_request_once(
    sims: StartSims, own_redis: StartRedis, procs: list[Proc], tmp_path: Path
) -> None:
    (w,) = await sims(1, speedup=200.0)
    redis = own_redis(persist=True)
    prefix = f"rel-kill-{uuid.uuid4().hex[:8]}:"
    tenants = tenants_of(alpha={"rpm": 100_000, "tpm": 100_000_000, "max_concurrency": 50})
    env = write_env(
        tmp_path / "cfg", fleet_of([w.url]), tenants, redis_url=redis.url, key_prefix=prefix,
        spool_dir=tmp_path / "spool", health_interval_s=30,
    )  # fmt: skip
    gateway = start_gateway("gateway", env=env, log_dir=tmp_path)
    procs.append(gateway)
    results: list[tuple[float, StreamResult]] = []
    stop = asyncio.Event()
    traffic = asyncio.create_task(_traffic(gateway.url, stop, results))
    await eventually(lambda: sum(r.ok for _, r in results) >= 20, timeout_s=20)
    assert redis.terminate() == 0
    down_at = time.monotonic()
    await eventually(lambda: sum(r.ok for t, r in results if t > down_at) >= 40, timeout_s=20)
    stop.set()
    await traffic
    await eventually(lambda: _no_backlog(gateway.url), timeout_s=10)  # every answered request is durably spooled
    gateway.kill()
    spooled = (tmp_path / "spool" / "usage.jsonl").read_bytes().count(b"\n")
    restarted = start_gateway("gateway-2", env=env, log_dir=tmp_path / "after")
    procs.append(restarted)
    procs.append(start_redis(log_dir=redis.log_path.parent, port=redis.port, persist=True, name="redis-2"))
    answered = {r.headers["x-request-id"] for _, r in results if r.ok}
    store = RedisStore.from_url(redis.url, prefix=prefix)
    try:
        await eventually(lambda: _all_billed(store, len(answered)), timeout_s=20)
        records = (await store.usage("alpha", since=0, until=math.inf, limit=10 * MAX_REQUESTS)).records
    finally:
        await store.close()
    assert spooled > 0, "nothing was spooled during the outage"
    ids = [r.request_id for r in records]
    assert len(ids) == len(set(ids)), "a request was billed twice"
    assert set(ids) == answered, (len(set(ids) - answered), len(answered - set(ids)))
    spool = tmp_path / "spool" / "usage.jsonl"
    await eventually(lambda: not spool.read_bytes(), timeout_s=5)  # the replay commits just after the store took it


async def _all_billed(store: RedisStore, answered: int) -> bool:
    return (await store.usage("alpha", since=0, until=math.inf, limit=0)).requests >= answered
