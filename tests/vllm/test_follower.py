"""The headless node's supervisor (``workers.vllm.follower``) against a real leader supervisor (its restart control
over HTTP, its "vLLM" the stand-in of ``test_supervisor``): when the leader restarts in the other mode, the follower
restarts its own process in that mode, so the whole group restarts together; a process that exits by itself is
started again; an unanswered leader changes nothing."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import cast

import httpx

from bench.procs import free_port
from fleet.clock import SystemClock
from fleet.restart import RestartClient, RestartRequest
from workers.vllm.follower import Follower
from workers.vllm.launcher import LaunchPlan

from .test_supervisor import TOKEN, serve_control, stand_in, until_back


def headless(root: Path) -> tuple[Follower, list[bool], RestartClient, httpx.AsyncClient]:
    """A follower whose "vLLM" is a sleeping Python process; the modes it started, in order."""
    started: list[bool] = []

    def plan_for(drafter: bool) -> LaunchPlan:
        started.append(drafter)
        return LaunchPlan((sys.executable, "-c", "import time; time.sleep(120)"))

    client = httpx.AsyncClient()
    leader = RestartClient(client, control_token=TOKEN, timeout_s=2.0)
    follower = Follower(
        plan_for, leader=leader, leader_url="http://127.0.0.1:1", log_dir=root, clock=SystemClock(), stop_timeout_s=5
    )
    return follower, started, leader, client


async def test_the_follower_restarts_with_each_leader_restart_in_the_leaders_mode(tmp_path: Path) -> None:
    (tmp_path / "leader").mkdir()
    supervisor, _ = stand_in(free_port(), tmp_path / "leader")
    follower, started, leader, client = headless(tmp_path)
    control = cast(AsyncGenerator[str, None], serve_control(supervisor))  # an async generator function
    try:
        follower.start()
        await follower.step()  # leader not up yet: nothing changes
        assert started == [True]
        assert follower.running
        url = await anext(control)
        follower.leader_url = url
        await follower.step()  # first sight, same mode: no restart
        assert started == [True]
        await leader.restart(url, RestartRequest(drafter=False))
        await follower.step()  # the leader is restarting: this node restarts in its new mode
        assert started == [True, False]
        await until_back(leader, url)
        await follower.step()  # the same restart, finished: nothing more
        assert started == [True, False]
        assert follower.drafter is False
        assert follower.running
        proc = follower.vllm.popen
        assert proc is not None
        proc.kill()  # the node's vLLM died by itself (its leader went away)
        await asyncio.to_thread(proc.wait)
        await follower.step()
        assert started == [True, False, False]
        assert follower.running
    finally:
        await asyncio.to_thread(follower.stop)
        await control.aclose()
        await client.aclose()


async def test_run_follows_until_stopped_and_stops_its_process(tmp_path: Path) -> None:
    follower, started, _, client = headless(tmp_path)
    follower.poll_s = 0.05
    stop = asyncio.Event()
    try:
        task = asyncio.create_task(follower.run(stop))
        for _ in range(100):
            if follower.running:
                break
            await asyncio.sleep(0.05)
        assert follower.running
        stop.set()
        await asyncio.wait_for(task, timeout=10)
        assert not follower.running
        assert started == [True]
    finally:
        await client.aclose()
