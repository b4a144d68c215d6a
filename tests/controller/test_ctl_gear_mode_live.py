"""The drafter-free gear end to end on loopback: two simulated workers (the K3 profile, 600× real time, so its
600 s restart takes 1 s), the real gateway and the real controller sharing one memory store, under a bounded
load through the gateway. Worker w0 drains, restarts without its drafter, returns, and later goes back to the
drafter the same way; no request through the gateway fails, and w1 (which the operator keeps as started)
carries the load meanwhile."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from bench.policy.controller_lab import NO_TENANTS
from controller.actuator import HttpActuator
from controller.drafter_free import DrafterFreeConfig
from controller.gear_mode import GearModes, HttpRestarter
from controller.loop import Controller
from controller.settings import ControllerSettings
from controller.sources import HttpScrapeSource
from fleet.clock import SystemClock
from fleet.config import FleetConfig
from fleet.speculation_client import SpeculationClient
from fleet.store.memory import MemoryStore
from fleet.worker_mode import Mode, Phase, read_modes
from tests.gateway.harness import make_tenants, serve_gateway
from tests.sims import sim_servers

from .ctl_helpers import CONTROL_TOKEN as TOKEN

SPEEDUP = 600.0
RESTART_S = 1.0
"""The profile's 600 s restart at ``SPEEDUP``, real seconds (the rule's clock is the controller's, real time)."""
OFF_ONLY: dict[str, object] = {"k_tiers": (0,)}
"""With workers started at k = 0, a policy that only ever chooses k = 0: the stretch the rule waits for, without
waiting for a load to cause it."""


def controller_settings(policy: dict[str, object]) -> ControllerSettings:
    return ControllerSettings(
        tick_s=0.1, schedule_lease_s=5.0, leader_lease_s=1.0, control_token=TOKEN, metrics_port=0,
        stabiliser={"min_dwell_s": 0.2, "probe_interval_s": 3.0, "probe_s": 0.2, "stale_hold_s": 0.5},
        policy=policy,
    )  # fmt: skip


async def _load(client: httpx.AsyncClient, stop: asyncio.Event, outcomes: list[int]) -> None:
    body = {"model": "kimi-k3", "prompt": "hello", "max_tokens": 16, "ignore_eos": True}
    while not stop.is_set():
        resp = await client.post("/v1/completions", json=body)
        outcomes.append(resp.status_code)


async def _watch(store: MemoryStore, stop: asyncio.Event, seen: list[tuple[str, str]]) -> None:
    """Every distinct (mode, phase) of w0's record, in order, read once more after ``stop`` (the test stops
    as soon as it has seen the last one itself, maybe before this task's next poll)."""
    while True:
        stopping = stop.is_set()
        mode = (await read_modes(store)).get("w0")
        if mode is not None and (not seen or seen[-1] != (mode.mode.value, mode.phase.value)):
            seen.append((mode.mode.value, mode.phase.value))
        if stopping:
            return
        await asyncio.sleep(0.01)


async def _until_mode(store: MemoryStore, mode: Mode, timeout_s: float) -> None:
    for _ in range(int(timeout_s / 0.05)):
        record = (await read_modes(store)).get("w0")
        if record is not None and record.mode is mode and record.phase is Phase.SERVING:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"w0 did not reach {mode.value} serving within {timeout_s} s")


@pytest.mark.slow
async def test_drain_restart_without_the_drafter_and_back_under_load() -> None:
    clock = SystemClock()
    store = MemoryStore(clock=clock)
    async with (
        sim_servers(
            2, profile="kimi-k3-dspark-tp16", max_num_seqs=32, speedup=SPEEDUP, control_token=TOKEN, start_k=0
        ) as servers,
        httpx.AsyncClient() as http,
    ):
        workers = [{"id": s.settings.worker_id, "url": s.url, "model": "kimi-k3", "max_num_seqs": 32} for s in servers]
        workers[1]["allow_drafter_free"] = False  # the operator's per-worker switch: w1 stays as it was started
        fleet = FleetConfig.model_validate(
            {"models": [{"name": "kimi-k3", "profile": "kimi-k3-dspark-tp16"}], "workers": workers}
        )
        gears = GearModes(
            workers=fleet.workers,
            restart_s={w.id: RESTART_S for w in fleet.workers},
            config=DrafterFreeConfig(
                enabled=True, dwell_factor=1.0, min_dwell_s=0.0, drain_grace_s=0.3, horizon_s=3600.0
            ),
            restarter=HttpRestarter(http, control_token=TOKEN),
            store=store,
            clock=clock,
        )
        controller = Controller(
            fleet=fleet, tenants=NO_TENANTS, settings=controller_settings(OFF_ONLY),
            source=HttpScrapeSource(http, clock=clock), actuator=HttpActuator(http, control_token=TOKEN),
            store=store, clock=clock, gear_modes=gears,
        )  # fmt: skip
        async with serve_gateway(fleet, make_tenants(), store=store, clock=clock) as gw:
            stop, done = asyncio.Event(), asyncio.Event()
            outcomes: list[int] = []
            seen: list[tuple[str, str]] = []
            async with gw.client(timeout=10.0) as client:
                tasks = [asyncio.create_task(_load(client, done, outcomes)) for _ in range(4)]
                tasks += [asyncio.create_task(controller.run(stop)), asyncio.create_task(_watch(store, done, seen))]
                try:
                    await _until_mode(store, Mode.DRAFTER_FREE, timeout_s=30.0)
                    state = await SpeculationClient(http, control_token=TOKEN).state(servers[0].url)
                    assert state.k_max == 0, "restarted without the drafter: k = 0 is all it can run"
                    assert servers[0].worker.restarts == 1
                    served_off = len(outcomes)
                    # Speculation pays again (the default gears at this light load): back to the drafter.
                    controller.settings = controller_settings({})
                    await _until_mode(store, Mode.DRAFTER, timeout_s=30.0)
                finally:
                    done.set()
                    stop.set()
                    await asyncio.gather(*tasks)
    assert servers[0].worker.restarts == 2
    assert servers[1].worker.restarts == 0, "forbidden by the operator, it carried the load meanwhile"
    move = [
        ("drafter", "draining"),
        ("drafter", "restarting"),
        ("drafter-free", "returning"),
        ("drafter-free", "serving"),
    ]
    back = [
        ("drafter-free", "draining"),
        ("drafter-free", "restarting"),
        ("drafter", "returning"),
        ("drafter", "serving"),
    ]
    assert seen == [("drafter", "serving"), *move, *back]
    assert set(outcomes) == {200}, f"failed requests: {[c for c in outcomes if c != 200]}"
    assert len(outcomes) > served_off > 0
