"""The drafter-free gear on the real CPU vLLM (heavy: three vLLM starts, ~2 min on 2 cores).

The tiny worker runs under the supervisor (``workers.vllm.supervisor``) beside a simulated worker serving the same
model, behind the real gateway, under a bounded load. ``controller.gear_mode`` drains the vLLM worker, restarts it
without its speculative config, returns it to service, and later takes it back to the drafter the same way,
from observations read off the worker's real ``/metrics``. No request through the gateway fails; the restarted
worker serves requests in each mode, and its plugin reports speculation control only while the drafter is loaded.

Run: ``scripts/heavy-tests.sh tests/vllm/test_real_drafter_free.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from bench.procs import free_port
from controller.drafter_free import DrafterFreeConfig
from controller.gear_mode import GearModes, GearObservation, HttpRestarter
from fleet.clock import SystemClock
from fleet.config import FleetConfig
from fleet.scrape import parse_worker_metrics
from fleet.speculation import SPECULATION_PATH
from fleet.store.memory import MemoryStore
from fleet.worker_mode import Mode, Phase
from tests.gateway.harness import make_tenants, serve_gateway
from workers.sim.server import SimServer
from workers.sim.settings import SimWorkerSettings
from workers.vllm.cpu_server import tiny_plan, tiny_worker
from workers.vllm.launcher import LaunchPlan
from workers.vllm.supervisor import Supervisor, supervisor_app

from .conftest import CONTROL_TOKEN

pytestmark = [pytest.mark.vllm, pytest.mark.heavy, pytest.mark.timeout(1500)]

MOVE_TIMEOUT_S = 600.0
"""A move includes one vLLM start (20–30 s on an idle 2-core machine, minutes on a loaded one)."""
NOMINAL_RESTART_S = 1.0
WORKER_TIMEOUT_S = 30.0
"""Every call of the test to the worker itself. The plugin answers GET /gearshift/v1/speculation from the engine,
between two steps: at load 11 a freshly restarted worker's first steps under the test's load passed httpx's
implicit 5 s (ReadTimeout after the move back to the drafter)."""
GEARS = DrafterFreeConfig(
    enabled=True, dwell_factor=1.0, min_dwell_s=0.0, drain_grace_s=1.0, headroom=1.0, forbidden=frozenset({"sim-0"}),
    restart_timeout_factor=MOVE_TIMEOUT_S / NOMINAL_RESTART_S,
)  # fmt: skip
"""The rule at once (1 × a nominal 1 s restart); the simulated worker stays as it was started and carries the load.
A restart is given up only past the test's own limit for a move: with the default factor (3 × 1 s) every real
start was given up after 3 s, the worker served as before, and the rule moved it again while the supervisor was
still starting it (drafter-free restarts in a loop until the test's timeout)."""


async def _load(client: httpx.AsyncClient, stop: asyncio.Event, outcomes: list[int]) -> None:
    body = {"model": "tiny", "prompt": "hello there", "max_tokens": 16, "ignore_eos": True}
    while not stop.is_set():
        outcomes.append((await client.post("/v1/completions", json=body)).status_code)
        await asyncio.sleep(0.05)


async def _observe(http: httpx.AsyncClient, url: str, wid: str) -> GearObservation:
    """What the controller would see: requests running or waiting from the worker's real ``/metrics``."""
    try:
        resp = await http.get(f"{url}/metrics", timeout=WORKER_TIMEOUT_S)
        resp.raise_for_status()
        scrape = parse_worker_metrics(resp.text, at_s=0.0, model="tiny")
    except (httpx.HTTPError, ValueError):
        return GearObservation(wid, False, None, True, True, 0.0, 1.0)
    return GearObservation(wid, True, scrape.running + scrape.waiting, True, True, 0.0, 1.0)


async def _move_until(gears: GearModes, http: httpx.AsyncClient, urls: dict[str, str], mode: Mode) -> None:
    for _ in range(int(MOVE_TIMEOUT_S / 0.5)):
        await gears.tick([await _observe(http, url, wid) for wid, url in urls.items()])
        record = gears.modes.get("tiny-0")
        if record is not None and record.mode is mode and record.phase is Phase.SERVING:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"tiny-0 did not reach {mode.value} serving: {gears.modes.get('tiny-0')}")


async def test_drain_restart_without_the_drafter_and_back_on_real_vllm(tiny_model_dir: Path, tmp_path: Path) -> None:
    vllm = tiny_worker(port=free_port(), model_dir=tiny_model_dir).model_copy(
        update={"restart_url": f"http://127.0.0.1:{free_port()}"}
    )
    env = {"GEARSHIFT_CONTROL_TOKEN": CONTROL_TOKEN, "GEARSHIFT_SPEC_POLL_SECONDS": "0.25"}

    def plan_for(drafter: bool) -> LaunchPlan:
        plan = tiny_plan(vllm, drafter=drafter)
        return LaunchPlan(plan.argv, {**plan.env, **env})

    supervisor = Supervisor(plan_for, url=vllm.url, log_dir=tmp_path, ready_timeout_s=600.0)
    sim = SimServer(
        SimWorkerSettings(worker_id="sim-0", port=0, model="tiny", speedup=50.0, control_token=CONTROL_TOKEN)
    )
    fleet = FleetConfig.model_validate({
        "models": [{"name": "tiny"}],
        "workers": [vllm.model_dump(), {"id": "sim-0", "url": "http://127.0.0.1:1", "model": "tiny"}],
    })  # fmt: skip
    await asyncio.to_thread(supervisor.start)
    await sim.start()
    runner = web.AppRunner(supervisor_app(supervisor, control_token=CONTROL_TOKEN), access_log=None)
    await runner.setup()
    assert vllm.restart_url is not None
    await web.TCPSite(runner, "127.0.0.1", int(vllm.restart_url.rsplit(":", 1)[1])).start()
    fleet = fleet.model_copy(
        update={"workers": (fleet.workers[0], fleet.workers[1].model_copy(update={"url": sim.url}))}
    )
    clock = SystemClock()
    store = MemoryStore(clock=clock)
    try:
        async with (
            httpx.AsyncClient(timeout=WORKER_TIMEOUT_S) as http,
            serve_gateway(
                fleet, make_tenants(), store=store, clock=clock, first_byte_timeout_s=60.0, request_timeout_s=120.0
            ) as gw,
        ):
            gears = GearModes(
                workers=fleet.workers, restart_s={"tiny-0": NOMINAL_RESTART_S}, config=GEARS,
                restarter=HttpRestarter(http, control_token=CONTROL_TOKEN), store=store, clock=clock,
            )  # fmt: skip
            urls = {"tiny-0": vllm.url, "sim-0": sim.url}
            done, outcomes = asyncio.Event(), list[int]()
            async with gw.client(timeout=180.0) as client:
                load = [asyncio.create_task(_load(client, done, outcomes)) for _ in range(3)]
                try:
                    await _move_until(gears, http, urls, Mode.DRAFTER_FREE)
                    off = (await http.get(vllm.url + SPECULATION_PATH)).json()
                    served_off = await _served(http, vllm.url, client)
                    await _move_until(gears, http, urls, Mode.DRAFTER)
                    on = (await http.get(vllm.url + SPECULATION_PATH)).json()
                    served_on = await _served(http, vllm.url, client)
                finally:
                    done.set()
                    await asyncio.gather(*load)
    finally:
        await runner.cleanup()
        await sim.stop()
        await asyncio.to_thread(supervisor.stop)
    assert supervisor.restarts == 2
    assert "error" in off or off.get("k_max", 0) == 0, f"drafter-free vLLM still reports speculation: {off}"
    assert on.get("k_max") == 4, on
    assert served_off > 0
    assert served_on > 0
    assert outcomes
    assert set(outcomes) == {200}, f"failed requests: {[c for c in outcomes if c != 200]}"


async def _served(http: httpx.AsyncClient, url: str, client: httpx.AsyncClient) -> float:
    """Requests the vLLM worker has finished since it last started, once the gateway has sent it some (at most 60
    requests through the gateway, a quarter second apart: its health probe may take a moment to see it back)."""
    served = 0.0
    for _ in range(60):
        (
            await client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 4})
        ).raise_for_status()
        text = (await http.get(f"{url}/metrics", timeout=WORKER_TIMEOUT_S)).text
        served = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                     if line.startswith("vllm:request_success_total"))  # fmt: skip
        if served > 0:
            break
        await asyncio.sleep(0.25)
    return served
