"""The vLLM supervisor's restart control (``workers.vllm.supervisor``) with a stand-in server process: Python's
``http.server`` answering ``/health`` (no vLLM needed). A restart swaps the process for the other mode's command;
one that does not start brings the old mode back; the control refuses a missing token and a second restart."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from bench.procs import free_port
from fleet.restart import RESTART_PATH, RestartClient, RestartRequest
from workers.vllm.launcher import LaunchPlan
from workers.vllm.supervisor import Supervisor, supervisor_app

TOKEN = "supervisor-test-token"


def stand_in(port: int, root: Path, *, broken_without_drafter: bool = False) -> tuple[Supervisor, list[bool]]:
    """A supervisor whose "vLLM" is an HTTP file server with a ``health`` file; the modes it started, in order."""
    (root / "health").write_text("ok")
    started: list[bool] = []

    def plan_for(drafter: bool) -> LaunchPlan:
        started.append(drafter)
        if broken_without_drafter and not drafter:
            return LaunchPlan((sys.executable, "-c", "raise SystemExit(3)"))
        argv = (sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(root))
        return LaunchPlan(argv)

    supervisor = Supervisor(
        plan_for, url=f"http://127.0.0.1:{port}", log_dir=root, ready_timeout_s=20.0, stop_timeout_s=5
    )
    return supervisor, started


async def serve_control(supervisor: Supervisor) -> AsyncIterator[str]:
    await asyncio.to_thread(supervisor.start)
    runner = web.AppRunner(supervisor_app(supervisor, control_token=TOKEN), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await asyncio.to_thread(supervisor.stop)


async def until_back(client: RestartClient, url: str) -> None:
    for _ in range(200):
        if not (await client.state(url)).restarting:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the restart did not finish within 20 s")


@pytest.fixture
def port() -> int:
    return free_port()


async def test_a_restart_runs_the_other_modes_command_and_the_server_answers_again(port: int, tmp_path: Path) -> None:
    supervisor, started = stand_in(port, tmp_path)
    async for url in serve_control(supervisor):
        async with httpx.AsyncClient() as http:
            client = RestartClient(http, control_token=TOKEN)
            assert (await client.state(url)).drafter is True
            accepted = await client.restart(url, RestartRequest(drafter=False))
            assert accepted.restarting
            second = await http.post(
                url + RESTART_PATH, json={"drafter": True}, headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert second.status_code == 409, "one restart at a time"
            await until_back(client, url)
            state = await client.state(url)
            assert (state.drafter, state.restarts) == (False, 1)
            assert state.restart_s is not None
            assert (await http.get(f"http://127.0.0.1:{port}/health")).status_code == 200
            refused = await http.post(url + RESTART_PATH, json={"drafter": True})
            assert refused.status_code == 401
    assert started == [True, False]


async def test_a_mode_that_does_not_start_brings_the_old_one_back(port: int, tmp_path: Path) -> None:
    supervisor, started = stand_in(port, tmp_path, broken_without_drafter=True)
    async for url in serve_control(supervisor):
        async with httpx.AsyncClient() as http:
            client = RestartClient(http, control_token=TOKEN)
            await client.restart(url, RestartRequest(drafter=False))
            await until_back(client, url)
            state = await client.state(url)
            assert state.drafter is True, "back in the old mode: the controller serves it as before"
            assert (await http.get(f"http://127.0.0.1:{port}/health")).status_code == 200
    assert started == [True, False, True]
