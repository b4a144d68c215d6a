"""Reliability harness: fleet and tenant configs for real simulated workers, and a real gateway (uvicorn on a
free loopback port, the gateway's own ``create_app``) served in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.soak.client import StreamResult, stream_chat
from fleet.config import FleetConfig, TenantsConfig, key_digest
from fleet.store.protocol import Store
from fleet.store.redis import RedisStore
from tests.gateway.harness import RunningGateway, serve_gateway

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
    "header_timeout_s": 1.0,
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


def write_env(
    directory: Path, fleet: FleetConfig, tenants: TenantsConfig | None = None, **settings: Any
) -> dict[str, str]:
    """Write the fleet and tenants YAML files into ``directory``; the ``GEARSHIFT_*`` environment of a process
    that uses them with the test pepper and admin key (``settings`` add ``GEARSHIFT_<NAME>`` variables)."""
    directory.mkdir(parents=True, exist_ok=True)
    fleet_file, tenants_file = directory / "fleet.yaml", directory / "tenants.yaml"
    fleet_file.write_text(yaml.safe_dump(fleet.model_dump(mode="json")))
    tenants_file.write_text(yaml.safe_dump((tenants or tenants_of()).model_dump(mode="json")))
    env = {
        "GEARSHIFT_FLEET_FILE": str(fleet_file),
        "GEARSHIFT_TENANTS_FILE": str(tenants_file),
        "GEARSHIFT_KEY_PEPPER": PEPPER,
        "GEARSHIFT_ADMIN_KEY": ADMIN_KEY,
        "GEARSHIFT_HOST": "127.0.0.1",
    }
    return {**env, **{f"GEARSHIFT_{k.upper()}": str(v) for k, v in settings.items()}}


def chat(max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens, **extra}


LiveGateway = RunningGateway
"""A gateway served in the test's event loop (``tests.gateway.harness.serve_gateway``, the one harness)."""


def live_gateway(
    fleet: FleetConfig, tenants: TenantsConfig | None = None, *, store: Store | None = None, **settings: Any
) -> contextlib.AbstractAsyncContextManager[RunningGateway]:
    """``serve_gateway`` with these tests' keys and ``FAST`` settings, overridden by ``settings``."""
    return serve_gateway(fleet, tenants or tenants_of(), store=store, base=FAST, keys=KEYS, seed=11, **settings)


@contextlib.asynccontextmanager
async def redis_replicas(
    url: str, fleet: FleetConfig, tenants: TenantsConfig, *, prefix: str, cluster: bool = False
) -> AsyncIterator[list[LiveGateway]]:
    """Two gateway replicas, each with its own client of one Redis (or Redis Cluster) under ``prefix``."""
    stores = [RedisStore.from_url(url, prefix=prefix, cluster=cluster) for _ in range(2)]
    try:
        async with (
            live_gateway(fleet, tenants, store=stores[0]) as a,
            live_gateway(fleet, tenants, store=stores[1]) as b,
        ):
            yield [a, b]
    finally:
        for store in stores:
            await store.close()


async def fire_alternating(
    gws: list[LiveGateway], n: int, *, max_tokens: int, key: str = KEYS["alpha"], limit: int = 64
) -> list[StreamResult]:
    """``n`` streamed chats alternating between the replicas, at most ``limit`` in flight."""
    sem = asyncio.Semaphore(limit)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def one(i: int) -> StreamResult:
            async with sem:
                return await stream_chat(s, gws[i % len(gws)].url, key=key, body=chat(max_tokens))

        return list(await asyncio.gather(*(one(i) for i in range(n))))
