"""The simulated worker's restart fault (``restart_falls_back``): a restart asked for without the drafter takes
its ``restart_s`` and comes back with the drafter, as the vLLM supervisor does when the new mode fails to start;
without the fault the same restart comes back drafter-free."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from fleet.restart import RestartClient, RestartRequest
from tests.sims import sim_servers

TOKEN = "test-control-token"


@pytest.mark.parametrize("falls_back", [False, True])
async def test_a_restart_comes_back_in_the_old_mode_only_with_the_fault(falls_back: bool) -> None:
    async with (
        sim_servers(1, speedup=600.0, control_token=TOKEN, restart_falls_back=falls_back) as (sim,),
        httpx.AsyncClient() as http,
    ):
        client = RestartClient(http, control_token=TOKEN)
        started = await client.restart(sim.url, RestartRequest(drafter=False, reason="test"))
        assert started.restarting
        for _ in range(200):  # the K3 profile's 600 s restart at 600x: 1 s
            state = await client.state(sim.url)
            if not state.restarting:
                break
            await asyncio.sleep(0.02)
        assert (state.restarting, state.restarts) == (False, 1), state
        assert state.drafter is falls_back
        assert sim.worker.drafter_loaded is falls_back
