"""A real gearshift stack on loopback, scraped by a real Prometheus, for running dashboard queries on real data.

The stack, in the test's event loop: simulated workers (one refuses the controller's token, so actuation
failures exist), one flaky worker (healthy, but its completions and metrics fail, so retries, ejections and
scrape failures exist), a gateway and a controller sharing one in-memory store. Prometheus (Debian's
``prometheus`` binary) runs as a subprocess with the repository's rule files and a 1 s scrape interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from aiohttp import web

from bench.procs import free_port
from controller.app import ControllerComponent
from controller.placement import PlacementConfig
from controller.settings import ControllerSettings
from controller.stabiliser import StabiliserConfig
from fleet.clock import SystemClock
from fleet.config import FleetConfig, TenantsConfig, key_digest, load_tenants
from fleet.store.memory import MemoryStore
from gateway.http.serve import GatewayServer
from gateway.settings import GatewaySettings
from gateway.wiring import GatewayDeps
from workers.sim.server import SimServer
from workers.sim.settings import SimWorkerSettings

from .deploy_promql import rule_files

PEPPER = "gearshift-dev-pepper"
KEYS = {"demo": "gs-demo-key", "batch-demo": "gs-batch-key", "tiny": "gs-tiny-key"}
"""API key per tenant: the embedded demo tenants, plus ``tiny`` whose 2 requests/min trip its limit."""


@dataclass
class Stack:
    gateway_url: str
    targets: dict[str, list[tuple[str, dict[str, str]]]]
    """Scrape job → (host:port, extra labels) for Prometheus."""


def tenants() -> TenantsConfig:
    base = load_tenants().model_dump(mode="json")
    base["tenants"].append(
        {
            "id": "tiny",
            "tier": "interactive",
            "rpm": 2,
            "keys": [{"id": "t", "digest": key_digest(KEYS["tiny"], pepper=PEPPER)}],
        }
    )
    return TenantsConfig.model_validate(base)


async def _flaky_worker() -> tuple[web.AppRunner, str]:
    """Answers its health probe, fails everything else with 500 (an engine that broke after start-up)."""

    async def ok(_: web.Request) -> web.Response:
        return web.json_response({})

    async def fail(_: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "engine dead", "type": "api_error"}}, status=500)

    app = web.Application()
    app.router.add_get("/health", ok)
    app.router.add_route("*", "/{tail:.*}", fail)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@contextlib.asynccontextmanager
async def running_stack(tmp_path: Path) -> AsyncIterator[Stack]:
    sims = [
        # Random-token traffic: the least predictable class, so the controller shortens drafts (and actuates)
        # even at the stack's low load.
        SimServer(SimWorkerSettings(worker_id="sim-0", port=0, speedup=20.0, seed=0, default_workload="random")),
        SimServer(
            SimWorkerSettings(
                worker_id="sim-1",
                port=0,
                speedup=20.0,
                seed=1,
                control_token="not-the-token",
                default_workload="random",
            )
        ),
    ]
    for sim in sims:
        await sim.start()
    flaky, flaky_url = await _flaky_worker()
    urls = {"sim-0": sims[0].url, "sim-1": sims[1].url, "flaky": flaky_url}
    fleet = {
        "models": [{"name": "kimi-k3"}],
        "workers": [{"id": i, "url": u, "model": "kimi-k3"} for i, u in urls.items()],
    }
    fleet_file, tenants_file = tmp_path / "fleet.yaml", tmp_path / "tenants.yaml"
    fleet_file.write_text(yaml.safe_dump(fleet))
    tenants_file.write_text(yaml.safe_dump(tenants().model_dump(mode="json")))
    clock = SystemClock()
    store = MemoryStore(clock=clock)
    common: dict[str, Any] = {"fleet_file": fleet_file, "tenants_file": tenants_file}
    gateway = GatewayServer(
        GatewayDeps(
            # overload_max_occupancy: two requests in flight per worker (of its 256 sequences), so the stack's four
            # streams queue (one place), and the overload panels (queue depth, queued time, sheds) have data to show.
            GatewaySettings(
                **common, port=0, state_refresh_s=0.1, health_interval_s=0.5, health_timeout_s=0.5,
                overload_max_occupancy=2 / 256, overload_queue_size=1,
            ),
            store=store, clock=clock, fleet=FleetConfig.model_validate(fleet), tenants=tenants(),
        ),
        handle_signals=False,
    )  # fmt: skip
    controller_port = free_port()
    controller = ControllerComponent(
        ControllerSettings(
            **common, tick_s=0.5, tenant_interval_s=2.0, leader_lease_s=2.0, schedule_lease_s=5.0, state_ttl_s=5.0,
            metrics_port=controller_port, metrics_host="127.0.0.1",
            stabiliser=StabiliserConfig(min_dwell_s=1.0, probe_interval_s=3.0, probe_s=1.0, up_ticks=1, down_ticks=1),
            placement=PlacementConfig(period_s=1.0, min_dwell_s=0.0),
        ),
        store=store, clock=clock,
    )  # fmt: skip
    await gateway.start()
    await controller.start()
    try:
        yield Stack(
            gateway_url=gateway.url,
            targets={
                "gearshift-gateway": [(gateway.url.removeprefix("http://"), {})],
                "gearshift-controller": [(f"127.0.0.1:{controller_port}", {})],
                "gearshift-worker": [(u.removeprefix("http://"), {"worker": i}) for i, u in urls.items()],
            },
        )
    finally:
        await controller.stop()
        await gateway.stop()
        await flaky.cleanup()
        for sim in sims:
            await sim.stop()


@contextlib.asynccontextmanager
async def running_prometheus(stack: Stack, tmp_path: Path) -> AsyncIterator[str]:
    """Debian's Prometheus scraping ``stack`` every second with the repository's rules; yields its base URL."""
    async with prometheus_scraping(stack.targets, tmp_path, rules=rule_files()) as url:
        yield url


@contextlib.asynccontextmanager
async def prometheus_scraping(
    targets: dict[str, list[tuple[str, dict[str, str]]]], tmp_path: Path, *, rules: list[Path]
) -> AsyncIterator[str]:
    """Debian's Prometheus scraping ``targets`` (job → ``(host:port, labels)``) and evaluating ``rules`` every
    second; yields its base URL."""
    exe = shutil.which("prometheus")
    assert exe is not None, "prometheus not found: run scripts/bootstrap.sh (Debian package `prometheus`)"
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rules],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [t], "labels": labels} for t, labels in job_targets]}
            for job, job_targets in targets.items()
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    proc = await asyncio.create_subprocess_exec(
        exe, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}", stdout=log, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient(timeout=0.5) as client:
            while not await _ready(client, url):
                assert proc.returncode is None, (tmp_path / "prometheus.log").read_text()
                assert time.monotonic() < deadline, "Prometheus did not become ready in 30 s"
                await asyncio.sleep(0.1)
        yield url
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), timeout=10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.close()


async def _ready(client: httpx.AsyncClient, url: str) -> bool:
    try:
        return (await client.get(f"{url}/-/ready")).status_code == 200
    except httpx.HTTPError:
        return False
