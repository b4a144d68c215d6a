"""Redis stopped and restarted during traffic (a redis-server this test owns, with an append-only file so a
restart keeps its data): the gateway keeps serving, reconnects by itself, and the usage ledger ends up holding
exactly what the clients were served."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from bench.procs import start_redis
from bench.soak.client import StreamResult, stream_chat
from fleet.store.redis import RedisStore
from tests.gateway.harness import eventually

from .rel_harness import KEYS, chat, fleet_of, live_gateway, tenants_of
from .rel_types import StartRedis, StartSims

pytestmark = pytest.mark.redis


async def _traffic(url: str, stop: asyncio.Event, out: list[tuple[float, StreamResult]]) -> None:
    """Four clients sending requests back to back until ``stop`` (bounded: at most 2 000 requests)."""
    async with aiohttp.ClientSession() as s:

        async def client() -> None:
            while not stop.is_set() and len(out) < 2000:
                r = await stream_chat(s, url, key=KEYS["alpha"], body=chat(3), timeout_s=10)
                out.append((time.monotonic(), r))
                if not r.ok:
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(client() for _ in range(4)))


async def test_gateway_serves_through_a_redis_restart_and_reconciles_usage(
    sims: StartSims, own_redis: StartRedis
) -> None:
    (w,) = await sims(1, speedup=200.0)
    redis = own_redis(persist=True)
    store = RedisStore.from_url(redis.url, prefix="rel-outage:")
    tenants = tenants_of(alpha={"rpm": 100_000, "tpm": 100_000_000, "max_concurrency": 100})
    results: list[tuple[float, StreamResult]] = []
    try:
        async with live_gateway(fleet_of([w.url]), tenants, store=store) as live:
            stop = asyncio.Event()
            traffic = asyncio.create_task(_traffic(live.url, stop, results))
            await eventually(lambda: sum(r.ok for _, r in results) >= 20)
            assert redis.terminate() == 0
            down_at = time.monotonic()
            await eventually(lambda: sum(1 for t, _ in results if t > down_at + 0.5) >= 20, timeout_s=10)
            restarted = start_redis(log_dir=redis.log_path.parent, port=redis.port, persist=True, name="redis-2")
            up_at = time.monotonic()
            try:
                await eventually(lambda: sum(r.ok for t, r in results if t > up_at + 0.5) >= 20, timeout_s=15)
                stop.set()
                await traffic
                await live.gw.ledger.idle()
                async with live.session() as s, s.get("/v1/usage", params={"since": 0}) as resp:
                    usage = await resp.json()
            finally:
                restarted.stop()
    finally:
        await store.close()
    during = [r for t, r in results if down_at + 0.5 < t < up_at]
    after = [r for t, r in results if t > up_at + 5.0]
    served = [r for _, r in results if r.ok]
    assert during, "no request was made while Redis was down"
    assert all(r.ok or (r.error and r.error.get("type")) or r.transport_error for r in during)
    assert all(r.ok for r in after), {r.error_type for r in after}
    assert usage["requests"] == len(served), "the ledger lost or double-counted requests"
    assert usage["completion_tokens"] == sum(r.completion_tokens for r in served)


@pytest.mark.parametrize("mode", ["open", "closed"])
async def test_gateway_keeps_serving_or_refuses_cleanly_while_redis_is_down(
    sims: StartSims, own_redis: StartRedis, mode: str
) -> None:
    (w,) = await sims(1, speedup=200.0)
    redis = own_redis(persist=False)
    store = RedisStore.from_url(redis.url, prefix="rel-down:")
    tenants = tenants_of(alpha={"rpm": 1000, "tpm": 1_000_000, "max_concurrency": 10})
    try:
        gateway = live_gateway(fleet_of([w.url]), tenants, store=store, store_failure_mode=mode)
        async with gateway as live, aiohttp.ClientSession() as s:
            assert (await stream_chat(s, live.url, key=KEYS["alpha"], body=chat(3))).ok
            assert redis.terminate() == 0
            down = [await stream_chat(s, live.url, key=KEYS["alpha"], body=chat(3), timeout_s=10) for _ in range(5)]
    finally:
        await store.close()
    if mode == "open":  # served on process-local limits
        assert all(r.ok for r in down), {r.error_type for r in down}
    else:  # refused at once with an OpenAI error that tells the client to come back
        assert all(r.status == 503 and r.error and r.error["code"] == "store_unavailable" for r in down), down
        assert all(r.headers.get("retry-after") for r in down)


async def test_a_store_idle_across_a_redis_restart_works_on_its_next_call(own_redis: StartRedis) -> None:
    redis = own_redis(persist=False)
    store = RedisStore.from_url(redis.url, prefix="rel-idle:")
    try:
        assert await store.ping()
        assert redis.terminate() == 0
        own_redis(port=redis.port, persist=False)
        assert await store.acquire_lease("x", "me", ttl_s=5.0)
    finally:
        await store.close()
