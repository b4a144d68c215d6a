"""Per-request speculation end to end on a real Redis: three simulated workers (the K3 profile, 600× real time,
so its 600 s restart takes 1 s), the controller and two gateway replicas, each with its own connection to one
``redis-server``.

The controller takes w0 to the drafter-free gear (a policy that only ever chooses k = 0 makes the stretch its
rule waits for; w1 and w2 are kept with their drafters by the operator's switch). Once both gateways read w0's
record, ``x-gearshift-speculation: off`` requests from a tenant whose policy allows ``off`` land only on w0,
through either gateway, while the same tenant's requests without the header still use every worker; a tenant
whose policy does not list the header gets a 400 that names it, from either gateway."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import httpx
import pytest

from controller.actuator import HttpActuator
from controller.drafter_free import DrafterFreeConfig
from controller.gear_mode import GearModes, HttpRestarter
from controller.loop import Controller
from controller.settings import ControllerSettings
from controller.sources import HttpScrapeSource
from fleet.clock import SystemClock
from fleet.config import FleetConfig
from fleet.store.redis import RedisStore
from fleet.worker_mode import Mode, Phase, read_modes
from gateway.routing.filters.eligibility import routable
from tests.gateway.harness import RunningGateway, eventually, make_tenants, serve_gateway
from tests.sims import sim_servers

MODEL = "kimi-k3"
TOKEN = "test-control-token"
HEADER = "x-gearshift-speculation"
BODY = {"model": MODEL, "prompt": "hello", "max_tokens": 8, "ignore_eos": True}


async def post_all(
    gateways: list[RunningGateway], tenant: str, n: int, headers: dict[str, str]
) -> list[httpx.Response]:
    """``n`` concurrent completions of ``tenant`` with ``headers``, alternating between the gateways."""
    clients = [g.client(tenant) for g in gateways]
    try:
        return list(await asyncio.gather(
            *(clients[i % len(clients)].post("/v1/completions", json=BODY, headers=headers) for i in range(n))
        ))  # fmt: skip
    finally:
        for c in clients:
            await c.aclose()


@pytest.mark.redis
@pytest.mark.slow
async def test_off_requests_land_only_on_the_drafter_free_worker_and_a_forbidden_header_gets_400(
    redis_url: str,
) -> None:
    prefix = f"test:{uuid.uuid4().hex[:12]}:"
    stores = [RedisStore.from_url(redis_url, prefix=prefix) for _ in range(3)]
    clock = SystemClock()
    tenants = make_tenants(alpha={"speculation_header": ["off"]})
    stop = asyncio.Event()
    async with (
        sim_servers(
            3, profile="kimi-k3-dspark-tp16", max_num_seqs=32, speedup=600.0, control_token=TOKEN, start_k=0
        ) as sims,
        httpx.AsyncClient() as http,
        contextlib.AsyncExitStack() as stack,
    ):
        workers = [
            {"id": s.settings.worker_id, "url": s.url, "model": MODEL, "max_num_seqs": 32,
             "allow_drafter_free": s.settings.worker_id == "w0"}
            for s in sims
        ]  # fmt: skip
        fleet = FleetConfig.model_validate(
            {"models": [{"name": MODEL, "profile": "kimi-k3-dspark-tp16"}], "workers": workers}
        )
        gears = GearModes(
            workers=fleet.workers, restart_s={w.id: 1.0 for w in fleet.workers},
            config=DrafterFreeConfig(
                enabled=True, dwell_factor=1.0, min_dwell_s=0.0, drain_grace_s=0.3, horizon_s=3600.0
            ),
            restarter=HttpRestarter(http, control_token=TOKEN), store=stores[0], clock=clock,
        )  # fmt: skip
        settings = ControllerSettings(
            tick_s=0.1, schedule_lease_s=5.0, leader_lease_s=1.0, control_token=TOKEN, metrics_port=0,
            stabiliser={"min_dwell_s": 0.2, "probe_interval_s": 3.0, "probe_s": 0.2, "stale_hold_s": 0.5},
            policy={"k_tiers": (0,)},
        )  # fmt: skip
        controller = Controller(
            fleet=fleet, tenants=tenants, settings=settings, source=HttpScrapeSource(http, clock=clock),
            actuator=HttpActuator(http, control_token=TOKEN), store=stores[0], clock=clock, gear_modes=gears,
        )  # fmt: skip
        gateways = [
            await stack.enter_async_context(serve_gateway(fleet, tenants, store=s, clock=clock)) for s in stores[1:]
        ]
        run = asyncio.create_task(controller.run(stop))
        try:

            async def w0_drafter_free_at_every_gateway() -> bool:
                record = (await read_modes(stores[0])).get("w0")
                if record is None or (record.mode, record.phase) != (Mode.DRAFTER_FREE, Phase.SERVING):
                    return False
                views = [g.gw.pool.views["w0"] for g in gateways]  # read, back up and probed healthy at each
                return all(v.mode is not None and v.mode.mode is Mode.DRAFTER_FREE and routable(v, clock.wall())
                           for v in views)  # fmt: skip

            await eventually(w0_drafter_free_at_every_gateway, timeout_s=10.0, every_s=0.05)
            assert sims[0].worker.restarts == 1
            assert sims[1].worker.restarts == sims[2].worker.restarts == 0
            started = clock.wall()
            off, auto, forbidden = await asyncio.gather(
                post_all(gateways, "alpha", 24, {HEADER: "off"}),
                post_all(gateways, "alpha", 24, {}),
                post_all(gateways, "beta", 4, {HEADER: "off"}),
            )
            for g in gateways:
                await g.gw.ledger.idle()
        finally:
            stop.set()
            await run
        records = await stores[0].ledger(since=started, until=time.time() + 1, limit=10_000)
    for s in stores:
        await s.close()
    assert [r.status_code for r in off + auto] == [200] * 48, [r.text for r in off + auto if r.status_code != 200]
    for refused in forbidden:
        assert refused.status_code == 400
        assert (refused.json()["error"]["param"], refused.json()["error"]["code"]) == (HEADER, "header_not_allowed")
    by_mode: dict[str, set[str]] = {}
    for r in records:
        by_mode.setdefault(r.speculation or "", set()).add(r.worker_id or "")
    assert by_mode["off"] == {"w0"}, "off: only the worker started without a drafter"
    assert by_mode["auto"] - {"w0"}, "without the header the same tenant's requests use the other workers too"
    assert {r.tenant for r in records} == {"alpha"}, "the refused requests reached no worker"
    assert len([r for r in records if r.speculation == "off"]) == 24
