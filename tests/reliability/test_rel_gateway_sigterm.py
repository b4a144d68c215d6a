"""``gearshift gateway`` receiving SIGTERM: it stops accepting new connections, lets the streams in flight finish
within its grace period, and exits 0."""

from __future__ import annotations

import asyncio
import functools
import signal
import time
from pathlib import Path

import aiohttp

from bench.procs import Proc, port_open, start_gateway, wait_until
from bench.soak.client import StreamResult, stream_chat

from .rel_harness import KEYS, chat, fleet_of, write_env
from .rel_types import StartSims


async def test_sigterm_stops_accepting_finishes_in_flight_streams_and_exits_0(
    sims: StartSims, procs: list[Proc], tmp_path: Path
) -> None:
    (w,) = await sims(1, speedup=1.0)
    env = write_env(tmp_path / "cfg", fleet_of([w.url]), health_interval_s=30, health_timeout_s=1)
    gateway = start_gateway("gateway", env=env, log_dir=tmp_path)
    procs.append(gateway)
    streaming = asyncio.Event()

    def started(r: StreamResult) -> None:
        if r.content_events >= 2:
            streaming.set()

    async with aiohttp.ClientSession() as s:
        body = chat(150, ignore_eos=True)  # about 1-2 s of tokens at real time: well inside the grace period
        flights = [
            asyncio.create_task(stream_chat(s, gateway.url, key=KEYS["alpha"], body=body, progress=started))
            for _ in range(3)
        ]
        await asyncio.wait_for(streaming.wait(), timeout=20)
        gateway.send(signal.SIGTERM)
        term_at = time.monotonic()
        refuses = functools.partial(_refuses, gateway.port)
        refused = await asyncio.to_thread(wait_until, refuses, timeout_s=3.0)
        results = await asyncio.gather(*flights)
        code = await asyncio.to_thread(gateway.popen.wait, 15)
    assert refused, "the gateway still accepted connections after SIGTERM"
    for r in results:
        assert r.ok, (r.error_type, r.error, gateway.log_tail())
        assert r.completion_tokens == 150
    assert max(r.ended for r in results) - term_at < 10
    assert code == 0, gateway.log_tail()
    assert "Application shutdown complete" in gateway.log_tail()


def _refuses(port: int) -> bool:
    return not port_open(port)
