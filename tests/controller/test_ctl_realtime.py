"""The closed loop once in real time: the Controller over HTTP against simulated worker servers on loopback
(``workers.sim.server.SimServer``, 20× faster than real time), with a load of concurrent HTTP clients."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from bench.policy.controller_lab import NO_TENANTS
from controller.actuator import HttpActuator
from controller.loop import Controller
from controller.settings import ControllerSettings
from controller.sources import HttpScrapeSource
from fleet.clock import SystemClock
from fleet.config import DrafterConfig, FleetConfig, ModelConfig, WorkerConfig
from fleet.perf import Profile
from fleet.store.memory import MemoryStore
from workers.sim.server import SimServer

from .ctl_helpers import CONTROL_TOKEN as TOKEN

SPEEDUP = 20.0
# Controller time constants in real seconds: one 0.1 s tick is 2 simulated seconds.
SETTINGS = ControllerSettings(
    tick_s=0.1,
    schedule_lease_s=5.0,
    leader_lease_s=1.0,
    control_token=TOKEN,
    stabiliser={"min_dwell_s": 0.5, "probe_interval_s": 3.0, "probe_s": 0.2, "stale_hold_s": 0.5},
    estimator={"correction_bounds": (0.01, 100.0)},
)


async def _stream(client: httpx.AsyncClient, url: str, stop: asyncio.Event) -> None:
    body = {"model": "kimi-k3", "prompt": "hello", "max_tokens": 80, "ignore_eos": True, "gearshift_workload": "chat"}
    while not stop.is_set():
        resp = await client.post(url + "/v1/completions", json=body, timeout=30)
        resp.raise_for_status()


async def _until(cond: Callable[[], bool], timeout_s: float) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout_s} s")


@pytest.mark.slow
async def test_real_time_closed_loop_over_http(sim_server: SimServer, lab_profile: Profile) -> None:
    fleet = FleetConfig(
        models=(ModelConfig(name="kimi-k3", profile=lab_profile.name),),
        workers=(WorkerConfig(id="rt-0", url=sim_server.url, model="kimi-k3", drafter=DrafterConfig(k_max=8)),),
    )
    clock = SystemClock()
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64)) as client:
        controller = Controller(
            fleet=fleet, tenants=NO_TENANTS, settings=SETTINGS, source=HttpScrapeSource(client, clock=clock),
            actuator=HttpActuator(client, control_token=TOKEN), store=MemoryStore(clock=clock), clock=clock,
            profiles={lab_profile.name: lab_profile},
        )  # fmt: skip
        rt = controller.workers["rt-0"]
        stop_controller, light, heavy = asyncio.Event(), asyncio.Event(), asyncio.Event()
        loop_task = asyncio.create_task(controller.run(stop_controller))
        load = [asyncio.create_task(_stream(client, sim_server.url, light))]
        try:
            # One stream of chat: a small k beats both k=0 and k_max.
            await _until(lambda: rt.k_applied is not None and 1 <= rt.k_applied <= 4, timeout_s=20)
            low_k = rt.k_applied
            # 32 streams: speculation stops paying in the lab profile.
            load += [asyncio.create_task(_stream(client, sim_server.url, heavy)) for _ in range(31)]
            await _until(lambda: rt.k_applied == 0, timeout_s=30)
        finally:
            light.set()
            heavy.set()
            await asyncio.gather(*load, return_exceptions=True)
            stop_controller.set()
            await asyncio.wait_for(loop_task, timeout=5)
        state = (await client.get(sim_server.url + "/gearshift/v1/speculation")).json()
    assert low_k is not None
    assert low_k > 0
    assert state["schedule"] == [[1, 256, 0]]
    assert state["version"] >= 2
    assert controller.metrics.registry.get_sample_value("gearshift_controller_k_applied", {"worker": "rt-0"}) == 0
