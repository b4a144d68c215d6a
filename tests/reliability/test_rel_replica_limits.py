"""Rate and token limits hold across two gateway replicas on one real Redis under concurrent load, to within
1 % of the configured limit."""

from __future__ import annotations

import asyncio
import uuid

import aiohttp
import pytest

from bench.procs import Proc
from bench.soak.client import StreamResult, stream_chat

from .rel_harness import KEYS, chat, fire_alternating, fleet_of, redis_replicas, tenants_of

pytestmark = pytest.mark.redis


async def test_request_limit_holds_across_two_replicas_under_concurrent_load(
    shared_workers: list[Proc], redis_url: str
) -> None:
    workers = shared_workers
    rpm = 300
    tenants = tenants_of(alpha={"rpm": rpm})
    async with redis_replicas(redis_url, fleet_of([w.url for w in workers]), tenants, prefix=_prefix()) as gws:
        results = await fire_alternating(gws, 2 * rpm, max_tokens=2)
    admitted = sum(r.ok for r in results)
    refused = [r for r in results if not r.ok]
    assert all(r.status == 429 and r.error and r.error["type"] == "rate_limit_error" for r in refused), {
        r.error_type for r in refused
    }
    assert all(r.headers.get("retry-after") for r in refused)
    assert abs(admitted - rpm) <= 0.01 * rpm, admitted


async def test_token_limit_holds_across_two_replicas_under_concurrent_load(
    shared_workers: list[Proc], redis_url: str
) -> None:
    workers = shared_workers
    tpm = 20_000
    tenants = tenants_of(alpha={"tpm": tpm})
    async with redis_replicas(redis_url, fleet_of([w.url for w in workers]), tenants, prefix=_prefix()) as gws:
        results = await fire_alternating(gws, 400, max_tokens=100)
        for g in gws:
            await g.gw.ledger.idle()
        async with gws[0].session() as s, s.get("/v1/usage") as resp:
            usage = await resp.json()
    served = [r for r in results if r.ok]
    refused = [r for r in results if not r.ok]
    used = sum(r.prompt_tokens + r.completion_tokens for r in served)
    assert refused, "the token limit never tripped"
    assert all(r.status == 429 for r in refused), {r.error_type for r in refused}
    assert used <= tpm * 1.01, f"{used} tokens served against a limit of {tpm}"
    assert usage["prompt_tokens"] + usage["completion_tokens"] == used


async def test_token_limit_holds_for_requests_with_several_choices(shared_workers: list[Proc], redis_url: str) -> None:
    workers = shared_workers
    tpm = 4_000
    tenants = tenants_of(alpha={"tpm": tpm})
    async with redis_replicas(redis_url, fleet_of([w.url for w in workers]), tenants, prefix=_prefix()) as gws:
        sem = asyncio.Semaphore(16)
        async with aiohttp.ClientSession() as s:

            async def one(i: int) -> StreamResult:
                async with sem:
                    return await stream_chat(s, gws[i % 2].url, key=KEYS["alpha"], body=chat(50, n=8))

            results = await asyncio.gather(*(one(i) for i in range(64)))
    used = sum(r.prompt_tokens + r.completion_tokens for r in results if r.ok)
    assert any(r.status == 429 for r in results)
    assert used <= tpm * 1.01, f"{used} tokens served against a limit of {tpm}"


def _prefix() -> str:
    return f"rel-lim-{uuid.uuid4().hex[:8]}:"
