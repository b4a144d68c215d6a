"""Fleet placement end to end on a real Redis: three simulated workers, two gateway replicas and the controller,
each with its own connection to one ``redis-server``.

A plan published to the store (as a leader before this one would have) splits the fleet: interactive work on
w0 and w1 at k = 6, batch maths on w2 at k = 1. The controller takes the plan over (its minimum dwell keeps it)
and republishes it with its own TTL, its loops run each pool's gear, and both gateways send each request to its
class's pool. Then the controller stops: the plan ages past its TTL, and both gateways route on load alone."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import httpx
import pytest

from controller.actuator import HttpActuator
from controller.loop import Controller
from controller.placement import PlacementConfig
from controller.settings import ControllerSettings
from controller.sources import HttpScrapeSource
from fleet.clock import SystemClock
from fleet.plan import FleetPlan, PoolPlan, publish_plan, read_plans
from fleet.store.protocol import UsageRecord
from fleet.store.redis import RedisStore
from tests.gateway.harness import RunningGateway, eventually, make_fleet, make_tenants, serve_gateway
from tests.sims import sim_servers

from .ctl_helpers import CONTROL_TOKEN

MODEL = "kimi-k3"
TTL_S = 2.0
"""The TTL the controller publishes the plan with, seconds."""
POOLS = {"w0": ("fast", 6), "w1": ("fast", 6), "w2": ("bulk", 1)}
"""Worker → (its pool, the pool's k) in the published plan."""
BODY = {"model": MODEL, "prompt": "hello", "max_tokens": 12, "ignore_eos": True}


async def burst(gateways: list[RunningGateway], tenant: str, n: int) -> None:
    """``n`` concurrent completions of ``tenant``, half through each gateway; every one must succeed."""
    clients = [g.client(tenant) for g in gateways]
    try:
        answers = await asyncio.gather(
            *(clients[i % len(clients)].post("/v1/completions", json=BODY) for i in range(n))
        )
    finally:
        for c in clients:
            await c.aclose()
    assert [a.status_code for a in answers] == [200] * n, [a.text for a in answers if a.status_code != 200]


async def served(store: RedisStore, since: float) -> dict[str, set[str]]:
    """Tenant → the workers its requests finished on since ``since`` (Unix s)."""
    records: list[UsageRecord] = await store.ledger(since=since, until=time.time() + 1, limit=10_000)
    out: dict[str, set[str]] = {}
    for r in records:
        out.setdefault(r.tenant, set()).add(r.worker_id or "")
    return out


@pytest.mark.redis
@pytest.mark.slow
async def test_gateways_follow_the_published_plan_then_fall_back_to_load_when_it_goes_stale(redis_url: str) -> None:
    prefix = f"test:{uuid.uuid4().hex[:12]}:"
    stores = [RedisStore.from_url(redis_url, prefix=prefix) for _ in range(3)]
    clock = SystemClock()
    tenants = make_tenants(beta={"workload": "maths"})
    stop = asyncio.Event()
    async with (
        sim_servers(3, speedup=50.0, control_token=CONTROL_TOKEN) as sims,
        httpx.AsyncClient() as http,
        contextlib.AsyncExitStack() as stack,
    ):
        fleet = make_fleet([s.url for s in sims])
        plan = FleetPlan(
            model=MODEL, version=100, issued_at=clock.wall(), ttl_s=30.0, reason="a previous leader's",
            pools=[PoolPlan(name="fast", classes=["interactive/*"], workers=["w0", "w1"], k=6),
                   PoolPlan(name="bulk", classes=["batch/*"], workers=["w2"], k=1)],
        )  # fmt: skip
        await publish_plan(stores[0], plan)
        settings = ControllerSettings(
            tick_s=0.2, schedule_lease_s=5.0, leader_lease_s=1.0, state_ttl_s=1.0, control_token=CONTROL_TOKEN,
            metrics_port=0, stabiliser={"min_dwell_s": 0.2, "probe_interval_s": 600.0, "probe_s": 0.4},
            placement=PlacementConfig(period_s=0.5, min_dwell_s=600.0, ttl_s=TTL_S),
        )  # fmt: skip
        controller = Controller(
            fleet=fleet, tenants=tenants, settings=settings, source=HttpScrapeSource(http, clock=clock),
            actuator=HttpActuator(http, control_token=CONTROL_TOKEN), store=stores[0], clock=clock,
        )  # fmt: skip
        gateways = [
            await stack.enter_async_context(serve_gateway(fleet, tenants, store=s, clock=clock)) for s in stores[1:]
        ]
        run = asyncio.create_task(controller.run(stop))

        async def read_by_every_gateway() -> bool:
            return all(g.gw.pool.views["w2"].pool is not None for g in gateways)

        try:
            await eventually(read_by_every_gateway)
            started = clock.wall()
            for _ in range(3):
                await asyncio.gather(burst(gateways, "alpha", 6), burst(gateways, "beta", 6))
            assert await served(stores[0], started) == {"alpha": {"w0", "w1"}, "beta": {"w2"}}

            async def gears_follow_the_pools() -> bool:
                await asyncio.gather(burst(gateways, "alpha", 2), burst(gateways, "beta", 2))
                return all(s.worker.control.k_for(1) == POOLS[s.settings.worker_id][1] for s in sims)

            await eventually(gears_follow_the_pools, timeout_s=8.0, every_s=0.1)
            held = (await read_plans(stores[0]))[MODEL]
            assert (held.version, held.pools, held.ttl_s) == (plan.version, plan.pools, TTL_S)
            assert held.issued_at > plan.issued_at, "the controller republished the plan it took over"
        finally:
            stop.set()
            await run

        async def stale_everywhere() -> bool:
            return all(
                g.gw.metrics.registry.get_sample_value("gearshift_gateway_plan_fresh", {"model": MODEL}) == 0
                for g in gateways
            )

        await eventually(stale_everywhere, timeout_s=3 * TTL_S)
        await asyncio.sleep(settings.state_ttl_s)  # the last published worker states expire too
        after = clock.wall()
        for _ in range(3):
            await burst(gateways, "beta", 6)
        assert (await served(stores[0], after))["beta"] - {"w2"}, "load-only: batch work reaches the other workers"
        for g in gateways:
            sample = g.gw.metrics.registry.get_sample_value
            assert sample("gearshift_gateway_placement_routes_total", {"model": MODEL, "outcome": "unplanned"})
    for s in stores:
        await s.close()
