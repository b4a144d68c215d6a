"""A request that reaches an idle keep-alive connection in time is answered even when the gateway's event loop ran
late (a loaded machine deschedules it). uvicorn closes an idle connection ``timeout_keep_alive`` after its last
response; on uvloop (the gateway process's loop) a late loop runs that due timer before it reads the sockets, so the
request already waiting on the connection was reset unread: the client got no response and the ledger no record
(the soak's "transport" errors, issue 23). Here the gateway is SIGSTOPped to run late on purpose."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp
import pytest
import uvicorn

from bench.procs import Proc, start_gateway, start_sim
from tests.reliability.rel_harness import KEYS, chat, fleet_of, tenants_of, write_env

KEEP_ALIVE_S = uvicorn.Config("gateway").timeout_keep_alive
"""The gateway's keep-alive (uvicorn's default: ``gateway.http.serve`` does not change it), seconds."""


@pytest.mark.slow
async def test_a_request_that_arrived_within_the_keep_alive_is_answered_after_a_late_loop(tmp_path: Path) -> None:
    sim = start_sim("w0", log_dir=tmp_path, speedup=50.0)
    procs: list[Proc] = [sim]
    try:
        gateway = start_gateway("gateway", env=write_env(tmp_path / "cfg", fleet_of([sim.url]), tenants_of()),
                                log_dir=tmp_path)  # fmt: skip
        procs.append(gateway)
        headers = {"authorization": f"Bearer {KEYS['alpha']}"}
        async with aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(limit=1)) as session:
            async with session.post(gateway.url + "/v1/chat/completions", json=chat(4)) as first:
                assert first.status == 200
                await first.read()
            answered = time.monotonic()  # the gateway finished the response before this: its timer is earlier
            await asyncio.sleep(KEEP_ALIVE_S - 1.5)
            gateway.send(signal.SIGSTOP)  # descheduled, as on a loaded machine
            try:
                second = asyncio.ensure_future(session.post(gateway.url + "/v1/chat/completions", json=chat(4)))
                await asyncio.sleep(0.5)  # written on the same connection, within the keep-alive
                assert time.monotonic() - answered < KEEP_ALIVE_S
                await asyncio.sleep(max(answered + KEEP_ALIVE_S + 1.0 - time.monotonic(), 0.0))  # the timer is due
            finally:
                gateway.send(signal.SIGCONT)
            async with await second as resp:
                assert resp.status == 200
                await resp.read()
    finally:
        for proc in reversed(procs):
            proc.stop()
