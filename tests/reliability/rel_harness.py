"""Reliability harness: fleet and tenant configs for real simulated workers, and a real gateway (uvicorn on a
free loopback port, the gateway's own ``create_app``) served in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import uvicorn

from fleet.clock import SystemClock
from fleet.config import FleetConfig, TenantsConfig, key_digest
from fleet.store import Store
from fleet.store_memory import MemoryStore
from gateway.app import create_app
from gateway.core import Gateway
from gateway.settings import GatewaySettings

PEPPER = "rel-pepper-3f9c"
ADMIN_KEY = "rel-admin-key-77b1"
MODEL = "kimi-k3"
KEYS = {"alpha": "sk-rel-alpha-0a1b2c", "beta": "sk-rel-beta-3d4e5f", "gamma": "sk-rel-gamma-6a7b8c"}
"""Tenant → its API key secret."""

# Short timeouts so every fault resolves in about a second (GatewaySettings fields).
FAST: dict[str, Any] = {
    "key_pepper": PEPPER,
    "admin_key": ADMIN_KEY,
    "port": 0,
    "connect_timeout_s": 0.5,
    "first_byte_timeout_s": 1.5,
    "idle_timeout_s": 1.5,
    "request_timeout_s": 5.0,
    "health_interval_s": 30.0,
    "health_timeout_s": 0.5,
    "state_refresh_s": 0.05,
    "key_cache_ttl_s": 0.2,
    "send_priority": True,
}


def fleet_of(urls: list[str], *, model: str = MODEL) -> FleetConfig:
    """Workers ``w0 … wN`` at ``urls``, all serving ``model``."""
    return FleetConfig.model_validate(
        {
            "models": [{"name": model}, {"name": "other-model"}],
            "workers": [{"id": f"w{i}", "url": u, "model": model} for i, u in enumerate(urls)],
        }
    )


def tenants_of(**overrides: dict[str, Any]) -> TenantsConfig:
    """alpha (interactive), beta (batch), gamma (interactive, only ``other-model``); ``overrides`` per tenant."""
    base: dict[str, dict[str, Any]] = {
        "alpha": {"tier": "interactive"},
        "beta": {"tier": "batch", "models": [MODEL]},
        "gamma": {"tier": "interactive", "models": ["other-model"]},
    }
    return TenantsConfig.model_validate(
        {
            "tiers": {
                "interactive": {"priority": 0, "tpot_target_s": 0.05, "speculation": "speed"},
                "batch": {"priority": 10, "speculation": "throughput", "sheddable": True},
            },
            "tenants": [
                {
                    "id": tid,
                    **fields,
                    **overrides.get(tid, {}),
                    "keys": [{"id": f"{tid}-1", "digest": key_digest(KEYS[tid], pepper=PEPPER)}],
                }
                for tid, fields in base.items()
            ],
        }
    )


def chat(max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens, **extra}


@dataclass
class LiveGateway:
    url: str
    gw: Gateway
    store: Store
    server: uvicorn.Server

    def session(self, tenant: str | None = "alpha") -> aiohttp.ClientSession:
        headers = {"authorization": f"Bearer {KEYS[tenant]}"} if tenant else {}
        return aiohttp.ClientSession(self.url, headers=headers, timeout=aiohttp.ClientTimeout(total=30))


@contextlib.asynccontextmanager
async def live_gateway(
    fleet: FleetConfig,
    tenants: TenantsConfig | None = None,
    *,
    store: Store | None = None,
    uvicorn_options: dict[str, Any] | None = None,
    **settings: Any,
) -> AsyncIterator[LiveGateway]:
    """The gateway app from ``create_app`` on uvicorn (httptools) on a free loopback port, in this loop."""
    clock = SystemClock()
    store = store or MemoryStore(clock=clock)
    app = create_app(
        GatewaySettings(**{**FAST, **settings}),
        store=store,
        clock=clock,
        fleet=fleet,
        tenants=tenants or tenants_of(),
        rng=random.Random(11),
    )
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", http="httptools", lifespan="on",
        **(uvicorn_options or {}),
    )  # fmt: skip
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(10):
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield LiveGateway(url=f"http://127.0.0.1:{port}", gw=app.state.gateway, store=store, server=server)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=15)


async def eventually(check: Callable[[], Awaitable[bool] | bool], *, timeout_s: float = 5.0) -> None:
    """Poll ``check`` every 20 ms until true; fail after ``timeout_s`` seconds."""
    for _ in range(int(timeout_s / 0.02) + 1):
        got = check()
        if got if isinstance(got, bool) else await got:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition not met within {timeout_s} s")
