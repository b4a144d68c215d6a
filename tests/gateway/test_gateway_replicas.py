"""Two gateway replicas on one real Redis share limits, ejections, keys and usage."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from fleet.config import FleetConfig, TenantsConfig
from fleet.store.redis import RedisStore

from .harness import ADMIN_KEY, MODEL, Mode, RunningGateway, StartUpstreams, make_fleet, make_tenants, serve_gateway

pytestmark = pytest.mark.redis

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@contextlib.asynccontextmanager
async def two_replicas(
    redis_url: str, fleet: FleetConfig, tenants: TenantsConfig, **settings: Any
) -> AsyncIterator[tuple[RunningGateway, RunningGateway]]:
    prefix = f"gs-test-{uuid.uuid4().hex[:8]}:"
    stores = [RedisStore.from_url(redis_url, prefix=prefix) for _ in range(2)]
    try:
        async with (
            serve_gateway(fleet, tenants, store=stores[0], **settings) as a,
            serve_gateway(fleet, tenants, store=stores[1], **settings) as b,
        ):
            yield a, b
    finally:
        for store in stores:
            await store.close()


async def test_request_limit_holds_across_replicas(redis_url: str, upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    tenants = make_tenants(alpha={"rpm": 3})
    async with two_replicas(redis_url, make_fleet([w.url]), tenants) as (a, b), a.client() as ca, b.client() as cb:
        statuses = [(await c.post("/v1/chat/completions", json=CHAT)).status_code for c in (ca, cb, ca, cb, ca)]
        assert statuses == [200, 200, 200, 429, 429]
        assert len(w.bodies) == 3


async def test_keys_ejections_and_usage_are_shared(redis_url: str, upstreams: StartUpstreams) -> None:
    bad, good = await upstreams(2)
    bad.mode = Mode.HTTP_500
    fleet = make_fleet([bad.url, good.url])
    async with two_replicas(redis_url, fleet, make_tenants(), eject_after_failures=1, eject_for_s=60) as (a, b):
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        async with httpx.AsyncClient(base_url=a.url, headers=admin) as c:
            secret = (await c.post("/admin/v1/keys", json={"tenant": "beta"})).json()["secret"]
        async with httpx.AsyncClient(base_url=b.url, headers={"authorization": f"Bearer {secret}"}) as c:
            for _ in range(10):  # replica b ejects the failing worker the first time it tries it
                assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
                if bad.bodies:
                    break
        assert bad.bodies
        ejected = await a.store.ejected(now=a.gw.clock.wall())
        assert "w0" in ejected
        await a.gw.pool.refresh_shared()
        assert a.gw.pool.views["w0"].ejected_until == ejected["w0"]
        await b.gw.ledger.idle()
        async with a.client("beta") as c:
            usage = (await c.get("/v1/usage")).json()
        assert usage["requests"] >= 1
        assert usage["completion_tokens"] == 2 * usage["requests"]
