"""Tenants at run time on a real Redis: a change made through one gateway replica is served by the other within
one second, and a budget reset works on Redis's spend counter."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from fleet.config import FleetConfig, TenantsConfig
from fleet.store.keys import spend_key
from fleet.store.redis import RedisStore

from .harness import ADMIN_KEY, KEYS, MODEL, RunningGateway, StartUpstreams, make_fleet, make_tenants, serve_gateway

pytestmark = pytest.mark.redis

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
PROPAGATION_S = 1.0
"""The issue's bound: every replica serves a change within a second."""


@contextlib.asynccontextmanager
async def two_replicas(
    redis_url: str, fleet: FleetConfig, tenants: TenantsConfig
) -> AsyncIterator[tuple[RunningGateway, RunningGateway]]:
    prefix = f"gs-test-{uuid.uuid4().hex[:8]}:"
    stores = [RedisStore.from_url(redis_url, prefix=prefix) for _ in range(2)]
    try:
        async with (
            serve_gateway(fleet, tenants, store=stores[0]) as a,
            serve_gateway(fleet, tenants, store=stores[1]) as b,
        ):
            yield a, b
    finally:
        for store in stores:
            await store.close()


async def seconds_until(check: Callable[[], Awaitable[bool]], *, limit_s: float) -> float:
    """Seconds until ``check`` holds, polled every 20 ms; fails past ``limit_s``."""
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        if await check():
            return time.monotonic() - start
        await asyncio.sleep(0.02)
    raise AssertionError(f"not seen within {limit_s} s")


async def test_the_other_replica_serves_a_change_within_a_second(redis_url: str, upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with two_replicas(redis_url, make_fleet([w.url]), make_tenants()) as (a, b):
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        async with (
            httpx.AsyncClient(base_url=a.url, headers=admin) as on_a,
            httpx.AsyncClient(base_url=b.url, headers={"authorization": f"Bearer {KEYS['alpha']}"}) as alpha_on_b,
        ):
            assert (await alpha_on_b.post("/v1/chat/completions", json=CHAT)).status_code == 200
            assert (await on_a.patch("/admin/v1/tenants/alpha", json={"suspended": True})).status_code == 200

            async def refused() -> bool:
                return (await alpha_on_b.post("/v1/chat/completions", json=CHAT)).status_code == 403

            suspended_after = await seconds_until(refused, limit_s=PROPAGATION_S)
            created = await on_a.post("/admin/v1/tenants", json={"id": "delta", "tier": "batch", "models": [MODEL]})
            assert created.status_code == 201
            secret = (await on_a.post("/admin/v1/keys", json={"tenant": "delta"})).json()["secret"]
            async with httpx.AsyncClient(base_url=b.url, headers={"authorization": f"Bearer {secret}"}) as delta_on_b:

                async def served() -> bool:
                    return (await delta_on_b.post("/v1/chat/completions", json=CHAT)).status_code == 200

                created_after = await seconds_until(served, limit_s=PROPAGATION_S)
        assert b.gw.tenants.tenant("delta") is not None
        assert b.gw.tenant_book.provenance("alpha").applied  # type: ignore[union-attr]
        print(
            f"seen by the other replica: the suspension after {suspended_after:.3f} s, the tenant {created_after:.3f} s"
        )


async def test_a_budget_reset_on_redis_lets_the_tenant_spend_again(redis_url: str, upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    tenants = make_tenants(alpha={"budget_usd": 2.0})
    async with two_replicas(redis_url, make_fleet([w.url]), tenants) as (a, b):
        await a.store.settle(windows=(), slots=(), spend={spend_key("alpha"): 2.5}, now=a.gw.clock.wall())
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        async with (
            httpx.AsyncClient(base_url=a.url, headers=admin) as on_a,
            httpx.AsyncClient(base_url=b.url, headers={"authorization": f"Bearer {KEYS['alpha']}"}) as alpha_on_b,
        ):
            assert (await alpha_on_b.post("/v1/chat/completions", json=CHAT)).status_code == 429
            reset = (await on_a.post("/admin/v1/tenants/alpha/budget/reset")).json()
            assert reset["spent_before_usd"] == pytest.approx(2.5)
            assert await b.store.spent(spend_key("alpha")) == pytest.approx(0.0, abs=1e-9)
            assert (await alpha_on_b.post("/v1/chat/completions", json=CHAT)).status_code == 200
