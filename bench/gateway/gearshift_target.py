"""The gearshift gateway as a benchmark target, with all of its work on: API-key auth, rate/token/concurrency
limits and budget on a real Redis, routing, metering to the Redis ledger, Prometheus metrics.

The bench's fleet is one worker (the fake upstream); its tenant has limits far above the offered load, so
every request pays for the limit checks without being refused. Run as
``python -m bench.gateway.gearshift_target --port N --upstream URL --redis-url URL``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from bench.gateway.procs import free_port, python_module, start, wait_http_ready
from bench.gateway.targets import Target
from fleet.clock import SystemClock
from fleet.config import (
    ApiKeyConfig,
    DrafterConfig,
    FleetConfig,
    ModelConfig,
    TenantConfig,
    TenantsConfig,
    TierConfig,
    WorkerConfig,
    WorkerKind,
    key_digest,
)
from fleet.store_factory import build_store

BENCH_KEY = "gs-bench-key"
"""The benchmark tenant's API key (loopback only)."""
MODEL = "kimi-k3"


def bench_fleet(upstream: str) -> FleetConfig:
    return FleetConfig(
        models=(ModelConfig(name=MODEL),),
        workers=(
            WorkerConfig(id="upstream", url=upstream, model=MODEL, kind=WorkerKind.VLLM, drafter=DrafterConfig()),
        ),
    )


def bench_tenants(pepper: str) -> TenantsConfig:
    return TenantsConfig(
        tiers={"interactive": TierConfig(priority=0, ttft_target_s=2.0, tpot_target_s=0.05)},
        tenants=(
            TenantConfig(
                id="bench",
                tier="interactive",
                rpm=1_000_000_000,
                tpm=1_000_000_000_000,
                max_concurrency=100_000,
                budget_usd=1e12,
                keys=(ApiKeyConfig(id="bench-1", digest=key_digest(BENCH_KEY, pepper=pepper)),),
            ),
        ),
    )


async def _serve(port: int, upstream: str, redis_url: str) -> None:
    from gateway.app import create_app
    from gateway.settings import GatewaySettings

    settings = GatewaySettings(port=port, redis_url=redis_url, send_priority=False)
    clock = SystemClock()
    store = build_store(settings, clock=clock)
    app = create_app(
        settings,
        store=store,
        clock=clock,
        fleet=bench_fleet(upstream),
        tenants=bench_tenants(settings.key_pepper.get_secret_value()),
    )
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, loop="none", http="httptools", access_log=False, log_level="warning"
    )
    try:
        await uvicorn.Server(config).serve()
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> None:
    import uvloop

    parser = argparse.ArgumentParser(description="The gearshift gateway configured for the benchmark.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--redis-url", required=True)
    args = parser.parse_args(argv)
    uvloop.run(_serve(args.port, args.upstream, args.redis_url))


@dataclass(frozen=True)
class GearshiftLauncher:
    name: str = "gearshift"

    def launch(self, *, upstream: str, redis_url: str, cpu: int | None, log_dir: Path) -> Target:
        port = free_port()
        argv = python_module(
            "bench.gateway.gearshift_target", "--port", str(port), "--upstream", upstream, "--redis-url", redis_url
        )
        child = start(self.name, argv, cpu=cpu, log_dir=log_dir)
        base = f"http://127.0.0.1:{port}"
        wait_http_ready(child, base + "/v1/models", headers={"Authorization": f"Bearer {BENCH_KEY}"}, timeout_s=60)
        return Target(
            self.name,
            base,
            api_key=BENCH_KEY,
            child=child,
            note="gearshift gateway: auth, limits + budget on Redis, routing, metering, metrics",
        )


if __name__ == "__main__":
    main()
