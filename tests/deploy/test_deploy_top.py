"""``gearshift top``: the pure computations on real exposition text, and ``--once`` against a running stack
(two simulated workers and a gateway on loopback, worker states published in the gateway's store)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client import generate_latest
from rich.console import Console

from bench.procs import free_port
from fleet.clock import SystemClock
from fleet.config import FleetConfig, load_tenants
from fleet.plan import FleetPlan, PoolPlan, publish_plan
from fleet.scrape import parse_worker_metrics
from fleet.store.memory import MemoryStore
from fleet.store.protocol import WorkerState
from gateway.http.serve import GatewayServer
from gateway.settings import GatewaySettings
from gateway.usage.metrics import GatewayMetrics
from gateway.wiring import GatewayDeps
from gearshift.cli.top import GatewayAdminStates, StoreStates, render
from gearshift.cli.top_model import Snapshot, WorkerSample, histogram_quantile, parse_gateway, tenant_rows, worker_rows
from workers.sim.server import SimServer
from workers.sim.settings import SimWorkerSettings

ADMIN_KEY = "top-test-admin"
DEMO_KEY = "gs-demo-key"  # the embedded demo tenant's key, under the default (development) pepper


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    # 50 observations up to 10 ms, 50 more up to 50 ms: rank 99 lies 49/50 of the way through (10, 50] ms.
    assert histogram_quantile(0.99, {0.01: 50, 0.05: 100, float("inf"): 100}) == pytest.approx(0.0492)
    assert histogram_quantile(0.5, {0.01: 50, 0.05: 100, float("inf"): 100}) == pytest.approx(0.01)
    assert histogram_quantile(0.99, {0.01: 0, float("inf"): 0}) is None
    assert histogram_quantile(0.99, {0.01: 0, 0.05: 0, float("inf"): 10}) == pytest.approx(0.05)


def test_rates_and_tier_quantiles_from_two_gateway_snapshots() -> None:
    metrics = GatewayMetrics()
    tenants = load_tenants()

    def snap(at_s: float) -> Snapshot:
        return Snapshot(at_s=at_s, workers={}, gateway=parse_gateway(generate_latest(metrics.registry).decode()))

    metrics.requests.labels(tenant="demo", model="kimi-k3", worker="w", status="ok").inc(10)
    before = snap(100.0)
    metrics.requests.labels(tenant="demo", model="kimi-k3", worker="w", status="ok").inc(20)
    metrics.requests.labels(tenant="demo", model="kimi-k3", worker="w", status="error").inc(10)
    for _ in range(99):
        metrics.tpot.labels(tier="interactive").observe(0.02)
    metrics.tpot.labels(tier="interactive").observe(0.3)
    rows = {row.tenant: row for row in tenant_rows(before, snap(110.0), tenants)}
    assert rows["demo"].requests_per_s == pytest.approx(3.0)
    assert rows["demo"].tpot_p99_s is not None
    assert 0.01 < rows["demo"].tpot_p99_s <= 0.03
    assert rows["demo"].tpot_target_s == tenants.tiers["interactive"].tpot_target_s
    assert rows["batch-demo"].requests_per_s == 0.0
    assert rows["batch-demo"].tpot_p99_s is None


def test_worker_rows_prefer_the_published_state_and_mark_silent_workers_down() -> None:
    fleet = FleetConfig.model_validate(
        {
            "models": [{"name": "m"}],
            "workers": [{"id": "a", "url": "http://a:1", "model": "m"}, {"id": "b", "url": "http://b:1", "model": "m"}],
        }
    )
    labels = '{engine="0",model_name="m"}'

    def text(tokens: int) -> str:
        return f"vllm:generation_tokens_total{labels} {tokens}\nvllm:num_requests_running{labels} 7\n"

    state = WorkerState(
        worker_id="a", model="m", k_desired=4, k_applied=2, accepted_length=2.5, reason="why", usd_per_mtok=9.0
    )
    before = Snapshot(0.0, {"a": WorkerSample("a", "m", parse_worker_metrics(text(100), at_s=0.0), state)})
    after = Snapshot(2.0, {"a": WorkerSample("a", "m", parse_worker_metrics(text(900), at_s=2.0), state)})
    a, b = worker_rows(before, after, fleet)
    assert (a.k_desired, a.k_applied, a.accepted_length, a.reason, a.usd_per_mtok) == (4, 2, 2.5, "why", 9.0)
    assert a.tokens_per_s == pytest.approx(400.0)
    assert a.running == 7.0
    assert a.status == "ok"
    assert b.status == "down"
    assert b.tokens_per_s is None


async def test_state_sources_read_the_store_and_survive_an_unreachable_gateway() -> None:
    store = MemoryStore(clock=SystemClock())
    await store.publish_worker_state(
        WorkerState(worker_id="a", model="m", k_desired=4, k_applied=4, accepted_length=3.0), ttl_s=60
    )
    states, healthy = await StoreStates(store).states()
    assert states["a"].k_desired == 4
    assert healthy == {}
    async with httpx.AsyncClient(timeout=2) as client:
        assert await GatewayAdminStates(client, f"http://127.0.0.1:{free_port()}", "key").states() == ({}, {})


# ---------------------------------------------------------------------------------------------- end to end
@contextlib.asynccontextmanager
async def running_stack(tmp_path: Path) -> AsyncIterator[tuple[str, Path, MemoryStore]]:
    sims = [SimServer(SimWorkerSettings(worker_id=f"sim-{i}", port=0, speedup=20.0, seed=i)) for i in range(2)]
    for sim in sims:
        await sim.start()
    fleet_file = tmp_path / "fleet.yaml"
    fleet = {
        "models": [{"name": "kimi-k3"}],
        "workers": [{"id": f"sim-{i}", "url": sim.url, "model": "kimi-k3"} for i, sim in enumerate(sims)],
    }
    fleet_file.write_text(yaml.safe_dump(fleet))
    clock = SystemClock()
    store = MemoryStore(clock=clock)
    settings = GatewaySettings(
        port=0, admin_key=ADMIN_KEY, state_refresh_s=0.05, health_interval_s=0.2, health_timeout_s=0.2
    )
    gateway = GatewayServer(
        GatewayDeps(
            settings, store=store, clock=clock, fleet=FleetConfig.model_validate(fleet), tenants=load_tenants()
        ),
        handle_signals=False,
    )
    await gateway.start()
    try:
        yield gateway.url, fleet_file, store
    finally:
        await gateway.stop()
        for sim in sims:
            await sim.stop()


async def drive(url: str, stop: asyncio.Event, *, max_requests: int = 400) -> int:
    """Streaming chat requests as the demo tenant, one after another, until ``stop`` (bounded in count)."""
    body = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 32, "stream": True}
    done = 0
    async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {DEMO_KEY}"}, timeout=10) as client:
        while not stop.is_set() and done < max_requests:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200, await response.aread()
                async for _ in response.aiter_bytes():
                    pass
            done += 1
    return done


@pytest.mark.slow
async def test_top_once_draws_workers_and_tenants_of_a_running_stack(tmp_path: Path) -> None:
    async with running_stack(tmp_path) as (url, fleet_file, store):
        state = WorkerState(
            worker_id="sim-0", model="kimi-k3", k_desired=4, k_applied=2, accepted_length=2.46,
            usd_per_mtok=12.34, reason="probe: positions above k are unobservable",
        )  # fmt: skip
        await store.publish_worker_state(state, ttl_s=120)
        pools = [PoolPlan(name="fast", classes=["interactive/*"], workers=["sim-0"], k=4),
                 PoolPlan(name="bulk", classes=["batch/*"], workers=["sim-1"], k=1)]  # fmt: skip
        await publish_plan(store, FleetPlan(model="kimi-k3", version=1, issued_at=time.time(), ttl_s=600, pools=pools))
        stop = asyncio.Event()
        traffic = asyncio.create_task(drive(url, stop))
        env = {
            **os.environ,
            "GEARSHIFT_FLEET_FILE": str(fleet_file),
            "GEARSHIFT_ADMIN_KEY": ADMIN_KEY,
            "COLUMNS": "200",
        }
        gearshift = Path(sys.executable).parent / "gearshift"
        proc = await asyncio.create_subprocess_exec(
            str(gearshift), "top", "--once", "--interval", "1.5", "--gateway", url, "--width", "200",
            "--svg", str(tmp_path / "top.svg"),
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
        stop.set()
        assert await asyncio.wait_for(traffic, timeout=30) > 0
    text = out.decode()
    assert proc.returncode == 0, text
    lines = {line.split("│")[1].strip(): line for line in text.splitlines() if line.count("│") > 5}
    sim0 = [cell.strip() for cell in lines["sim-0"].split("│")[1:-1]]
    assert sim0[:5] == ["sim-0", "kimi-k3", "fast", "4/2 ≠", "2.46"]
    assert sim0[8:10] == ["12.34", "ok"]
    assert sim0[10].startswith("probe: positions above k")
    assert lines["sim-1"].split("│")[3].strip() == "bulk"
    tokens = [float(line.split("│")[8].replace(",", "")) for key, line in lines.items() if key.startswith("sim-")]
    assert sum(tokens) > 0, text
    demo = [cell.strip() for cell in lines["demo"].split("│")[1:-1]]
    assert demo[1] == "interactive"
    assert float(demo[2]) > 0, text
    assert demo[4] == "50 ms"
    assert "probe: positions above k" in (tmp_path / "top.svg").read_text().replace("&#160;", " ")


@pytest.mark.parametrize("width", [60, 80, 120, 200])
def test_no_row_wraps_and_decisions_are_cut_to_the_terminal_width(width: int) -> None:
    fleet = FleetConfig.model_validate(
        {"models": [{"name": "kimi-k3"}], "workers": [{"id": "sim-0", "url": "http://a:1", "model": "kimi-k3"}]}
    )
    reason = "hold k=4: the gain of 3.1 % is below the 5 % threshold; TPOT 41 ms is within the 50 ms target. " * 3
    state = WorkerState(
        worker_id="sim-0", model="kimi-k3", k_desired=4, k_applied=2, accepted_length=2.46, reason=reason,
        usd_per_mtok=12.34,
    )  # fmt: skip
    text = 'vllm:generation_tokens_total{engine="0",model_name="kimi-k3"} %d\n'
    snap = [
        Snapshot(t, {"sim-0": WorkerSample("sim-0", "kimi-k3", parse_worker_metrics(text % n, at_s=t), state)})
        for t, n in ((0.0, 0), (2.0, 123_456))
    ]
    console = Console(width=width, record=True, color_system=None)
    console.print(render(snap[0], snap[1], fleet, load_tenants()))
    lines = console.export_text().splitlines()
    assert all(len(line) <= width for line in lines)
    (row,) = [line for line in lines if "4/2" in line]
    assert "sim-0" in row
    assert "ok" in row
    (decision,) = [line for line in lines if "hold k=4" in line]
    assert decision.rstrip(" │").endswith("…"), "a decision longer than the terminal is cut with an ellipsis"
    continued = [line for line in lines if "threshold" in line or "TPOT 41 ms" in line]
    assert continued in ([], [decision]), "the decision takes one line"


@pytest.mark.parametrize("width", [80, 200])
def test_each_workers_pool_comes_from_the_gateway_and_shows_at_any_width(width: int) -> None:
    fleet = FleetConfig.model_validate(
        {"models": [{"name": "kimi-k3"}], "workers": [{"id": f"sim-{i}", "url": "http://a:1", "model": "kimi-k3"}
                                                      for i in range(2)]}
    )  # fmt: skip
    metrics = GatewayMetrics()
    metrics.worker_pool.labels(worker="sim-0", pool="fast").set(1)
    gateway = parse_gateway(generate_latest(metrics.registry).decode())
    assert gateway.pools == {"sim-0": "fast"}
    state = WorkerState(worker_id="sim-0", model="kimi-k3", k_desired=6, k_applied=6, accepted_length=3.0, reason="ok")
    snap = [Snapshot(t, {"sim-0": WorkerSample("sim-0", "kimi-k3", None, state)}, gateway) for t in (0.0, 2.0)]
    assert [r.pool for r in worker_rows(snap[0], snap[1], fleet)] == ["fast", None]
    console = Console(width=width, record=True, color_system=None)
    console.print(render(snap[0], snap[1], fleet, load_tenants()))
    lines = console.export_text().splitlines()
    (row,) = [line for line in lines if "6/6" in line]
    if width >= 120:
        assert "fast" in row, "a column of the workers table"
    else:
        assert "sim-0  fast: ok" in [line.rstrip() for line in lines], "before its decision"
