"""The gateway's connection timers never drop a request the client sent in time (the soak's transport errors, issue
23: no response, no record).

- **A late loop.** uvloop (the gateway process's loop) runs due timers before it reads the sockets, so a gateway
  that ran late (a loaded machine deschedules it) closed, unread, a request that had arrived within the keep-alive
  of the last response, or a head sent at once on a new connection, when the keep-alive or the head timeout fell due
  meanwhile. Here the gateway is SIGSTOPped to run late on purpose, or the timers are fired before the loop runs.
- **A lagging client.** A client reuses a pooled connection on its own clock; one whose loop lags sees it idle for
  less than the gateway has. With uvicorn's 5 s keep-alive such reuses raced the gateway's close; the gateway now
  keeps an idle connection for ``keep_alive_s`` (75 s), longer than the clients' and balancers' own idle timeouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import cast

import aiohttp
import orjson
import pytest
import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.server import ServerState

from bench.procs import Proc, start_gateway, start_sim
from gateway.http.protocol import GuardedHttpToolsProtocol, guarded_protocol
from gateway.settings import GatewaySettings
from tests.reliability.rel_harness import KEYS, chat, fleet_of, tenants_of, write_env

from .harness import MODEL, StartUpstreams, make_fleet, make_settings, make_tenants, serve_gateway

pytestmark = pytest.mark.slow

KEEP_ALIVE_S = 5
"""The keep-alive the late-loop test gives its gateway, seconds (uvicorn's old default: short, so the test is)."""


def _request(body: dict[str, object], key: str) -> bytes:
    data = orjson.dumps(body)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {key}\r\ncontent-length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


async def _status(reader: asyncio.StreamReader) -> bytes:
    """The status line of the answer on ``reader``, or b"" when the gateway closed the connection instead."""
    try:
        return (await asyncio.wait_for(reader.readline(), 30)).strip()
    except ConnectionResetError:
        return b""


async def test_a_request_that_arrived_within_the_keep_alive_is_answered_after_a_late_loop(tmp_path: Path) -> None:
    """End to end on a real gateway process; without the check it fails in about half the runs here (where libuv
    polls after the SIGCONT decides it), the unit test below every time."""
    sim = start_sim("w0", log_dir=tmp_path, speedup=50.0)
    procs: list[Proc] = [sim]
    try:
        env = write_env(tmp_path / "cfg", fleet_of([sim.url]), tenants_of(), keep_alive_s=KEEP_ALIVE_S)
        gateway = start_gateway("gateway", env=env, log_dir=tmp_path)
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


@contextlib.asynccontextmanager
async def _accepted() -> AsyncIterator[tuple[GuardedHttpToolsProtocol, asyncio.Transport, socket.socket]]:
    """The gateway's protocol on a freshly accepted loopback connection, and the client's end of it."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:  # what the loop reads later: answered
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    config = uvicorn.Config(app, http=guarded_protocol(make_settings(header_timeout_s=60.0)), lifespan="off")
    config.load()
    protocol_class = cast(type[GuardedHttpToolsProtocol], config.http_protocol_class)
    protocol = protocol_class(config, ServerState(), {})
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    transport, _ = await asyncio.get_running_loop().connect_accepted_socket(lambda: protocol, sock=server)
    try:
        yield protocol, transport, client
    finally:
        transport.close()
        client.close()


async def _fire_with_and_without_unread_bytes(fire: Callable[[GuardedHttpToolsProtocol], None]) -> None:
    """A timer that falls due while the client's bytes wait in the socket (this loop ran late: nothing has read them
    yet; here the test fires the timer itself, before the loop runs) leaves the connection open; with nothing
    waiting, it closes it as before."""
    async with _accepted() as (protocol, transport, client):
        client.sendall(_request(chat(4), KEYS["alpha"]))
        time.sleep(0.05)  # noqa: ASYNC251 (on the wire and unread: the loop must not run meanwhile)
        fire(protocol)
        assert not transport.is_closing()
    async with _accepted() as (protocol, transport, _):
        fire(protocol)
        assert transport.is_closing()


async def test_the_keep_alive_spares_a_connection_whose_request_waits_unread() -> None:
    await _fire_with_and_without_unread_bytes(GuardedHttpToolsProtocol.timeout_keep_alive_handler)


async def test_the_head_timeout_spares_a_connection_whose_head_waits_unread() -> None:
    await _fire_with_and_without_unread_bytes(GuardedHttpToolsProtocol._head_timeout)


async def test_an_idle_connection_outlives_the_clients_own_idle_timeouts(upstreams: StartUpstreams) -> None:
    keep_alive_s = GatewaySettings.model_fields["keep_alive_s"].default
    assert keep_alive_s > 60  # aiohttp's pool 15 s, httpx's 5 s, an AWS ALB's 60 s
    (worker,) = await upstreams(1, chunks=2)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with serve_gateway(make_fleet([worker.url]), make_tenants()) as g:
        reader, writer = await asyncio.open_connection("127.0.0.1", g.port)
        try:
            writer.write(_request(body, g.keys["alpha"]))
            assert await _status(reader) == b"HTTP/1.1 200 OK"
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            await asyncio.sleep(6.0)  # past uvicorn's own keep-alive, 5 s
            writer.write(_request(body, g.keys["alpha"]))  # the same connection
            assert await _status(reader) == b"HTTP/1.1 200 OK"
        finally:
            writer.close()
