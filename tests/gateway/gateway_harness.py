"""Test harness: configs for fake fleets and tenants, and a real gateway (uvicorn on a free loopback port)
served in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from opentelemetry.sdk.trace.export import SpanExporter

from fleet.clock import Clock, SystemClock
from fleet.config import FleetConfig, TenantsConfig, key_digest
from fleet.store.memory import MemoryStore
from fleet.store.protocol import Store
from gateway.core import Gateway
from gateway.serve import GatewayServer
from gateway.settings import GatewaySettings

PEPPER = "test-pepper"
ADMIN_KEY = "test-admin-key"
MODEL = "kimi-k3"
KEYS = {"alpha": "sk-alpha", "beta": "sk-beta", "gamma": "sk-gamma"}
"""Tenant → its API key secret."""


def make_fleet(urls: list[str], *, model: str = MODEL) -> FleetConfig:
    return FleetConfig.model_validate(
        {
            "models": [{"name": model}, {"name": "other-model"}],
            "workers": [{"id": f"w{i}", "url": url, "model": model, "max_num_seqs": 64} for i, url in enumerate(urls)],
        }
    )


def make_tenants(**overrides: dict[str, Any]) -> TenantsConfig:
    """Tenants alpha (interactive), beta (batch) and gamma (may use only ``other-model``); ``overrides``
    replace fields per tenant id (``alpha={"rpm": 2}``)."""
    base: dict[str, dict[str, Any]] = {
        "alpha": {"tier": "interactive", "models": ["*"]},
        "beta": {"tier": "batch", "models": [MODEL]},
        "gamma": {"tier": "interactive", "models": ["other-model"]},
    }
    tenants = [
        {
            "id": tid,
            **fields,
            **overrides.get(tid, {}),
            "keys": [{"id": f"{tid}-1", "digest": key_digest(KEYS[tid], pepper=PEPPER)}],
        }
        for tid, fields in base.items()
    ]
    return TenantsConfig.model_validate(
        {
            "tiers": {
                "interactive": {"priority": 0, "tpot_target_s": 0.05, "speculation": "speed"},
                "batch": {"priority": 10, "speculation": "throughput", "sheddable": True},
            },
            "tenants": tenants,
        }
    )


def make_settings(**overrides: Any) -> GatewaySettings:
    defaults: dict[str, Any] = {
        "key_pepper": PEPPER,
        "admin_key": ADMIN_KEY,
        "port": 0,
        "connect_timeout_s": 1.0,
        "first_byte_timeout_s": 2.0,
        "idle_timeout_s": 2.0,
        "request_timeout_s": 5.0,
        "health_interval_s": 0.5,
        "health_timeout_s": 0.5,
        "state_refresh_s": 0.05,
        "key_cache_ttl_s": 0.2,
        "log_level": "WARNING",
    }
    return GatewaySettings(**{**defaults, **overrides})


@dataclass
class RunningGateway:
    url: str
    gw: Gateway
    store: Store

    def client(self, tenant: str | None = "alpha", **kwargs: Any) -> httpx.AsyncClient:
        headers = {"authorization": f"Bearer {KEYS[tenant]}"} if tenant else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, **{"timeout": 10.0, **kwargs})

    def admin(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10.0)


@contextlib.asynccontextmanager
async def serve_gateway(
    fleet: FleetConfig,
    tenants: TenantsConfig,
    *,
    store: Store | None = None,
    clock: Clock | None = None,
    span_exporter: SpanExporter | None = None,
    **settings: Any,
) -> AsyncIterator[RunningGateway]:
    """A real gateway on a free loopback port, served by uvicorn in this event loop."""
    clock = clock or SystemClock()
    store = store or MemoryStore(clock=clock)
    server = GatewayServer(
        make_settings(**settings),
        store=store,
        clock=clock,
        fleet=fleet,
        tenants=tenants,
        rng=random.Random(7),
        span_exporter=span_exporter,
        handle_signals=False,
    )
    await server.start()
    try:
        yield RunningGateway(url=server.url, gw=server.gateway, store=store)
    finally:
        await server.stop()


async def eventually(check: Callable[[], Awaitable[bool]], *, timeout_s: float = 5.0, every_s: float = 0.02) -> None:
    """Poll ``check`` until it is true; fail after ``timeout_s`` seconds."""
    for _ in range(int(timeout_s / every_s) + 1):
        if await check():
            return
        await asyncio.sleep(every_s)
    raise AssertionError(f"condition not met within {timeout_s} s")
