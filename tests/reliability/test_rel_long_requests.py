"""Defect 7 (issue 23): a long request keeps its concurrency slot, and a stream has a total limit.

- On a real Redis, the slot a request holds expires no sooner than the longest the gateway lets a request run
  (``request_timeout_s``, ``stream_timeout_s``): before the fix it expired after 600 s while a request could run 900 s,
  so a second request of a tenant at ``max_concurrency: 1`` was admitted beside it.
- A stream that runs past ``stream_timeout_s`` ends with an OpenAI error event and ``[DONE]`` (before the fix a stream
  that kept sending had no total limit)."""

from __future__ import annotations

import asyncio
import uuid

import aiohttp
import pytest
from redis.asyncio import Redis

from bench.soak.client import stream_chat
from fleet.store.redis import RedisStore

from .rel_harness import KEYS, chat, fleet_of, live_gateway, tenants_of
from .rel_types import StartSims

pytestmark = pytest.mark.redis


async def test_a_slot_outlives_the_longest_request(sims: StartSims, redis_url: str) -> None:
    (w,) = await sims(1, speedup=1.0)
    prefix = f"slot-{uuid.uuid4().hex[:8]}:"
    store = RedisStore.from_url(redis_url, prefix=prefix)
    redis = Redis.from_url(redis_url, decode_responses=True)
    tenants = tenants_of(alpha={"max_concurrency": 1})
    try:
        gateway = live_gateway(fleet_of([w.url]), tenants, store=store, request_timeout_s=900.0, stream_timeout_s=900.0)
        async with gateway as live, aiohttp.ClientSession() as s:
            longest = max(live.gw.settings.request_timeout_s, live.gw.settings.stream_timeout_s)
            request = asyncio.create_task(stream_chat(s, live.url, key=KEYS["alpha"], body=chat(400), timeout_s=60))
            key = f"{prefix}{{t:alpha}}:limit:concurrency"
            for _ in range(200):
                held = await redis.zrange(key, 0, -1, withscores=True)
                if held:
                    break
                await asyncio.sleep(0.02)
            assert held, "the request never took its slot"
            server_s, server_us = await redis.time()
            expires_at = float(held[0][1])
            assert expires_at - (server_s + server_us / 1e6) >= longest
            request.cancel()
    finally:
        await redis.aclose()
        await store.close()


async def test_a_stream_past_its_total_limit_ends_with_an_error_event_and_done(sims: StartSims) -> None:
    (w,) = await sims(1, speedup=1.0)  # about a hundred tokens a second: 2 000 tokens take far longer than 1 s
    async with live_gateway(fleet_of([w.url]), stream_timeout_s=1.0) as live, aiohttp.ClientSession() as s:
        r = await stream_chat(s, live.url, key=KEYS["alpha"], body=chat(2000), timeout_s=60)
    assert r.status == 200
    assert 0 < r.content_events < 2000, "cut short: some tokens, not all"
    assert r.error is not None, r
    assert "limit" in r.error["message"]
    assert r.done
