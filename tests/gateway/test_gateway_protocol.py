"""Limits on the request head (size, count, time) in the gateway's HTTP protocol, on a real server."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import orjson
import pytest

from .harness import KEYS, MODEL, RunningGateway, StartUpstreams, make_fleet, make_tenants, serve_gateway

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def _raw(g: RunningGateway, request: bytes) -> bytes:
    """Send raw bytes; return everything the server answers before closing the connection."""
    url = urlsplit(g.url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(5):
            return await reader.read()
    finally:
        writer.close()


@pytest.mark.parametrize(
    "headers",
    [b"x-padding: " + b"a" * 40_000 + b"\r\n", b"".join(b"x-h%d: v\r\n" % i for i in range(150))],
    ids=["one-huge-header", "too-many-headers"],
)
async def test_oversized_heads_get_431_and_the_server_keeps_serving(upstreams: StartUpstreams, headers: bytes) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g:
        answer = await _raw(g, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n" + headers + b"\r\n")
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 431 ")
        assert orjson.loads(body)["error"]["code"] == "headers_too_large"
        async with g.client() as c:
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200


async def test_a_slow_or_silent_client_is_disconnected(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants(), header_timeout_s=0.3) as g:
        url = urlsplit(g.url)
        silent = await asyncio.open_connection(url.hostname, url.port)
        slow = await asyncio.open_connection(url.hostname, url.port)
        slow[1].write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-a: ")
        async with asyncio.timeout(5):
            assert await silent[0].read() == b""  # closed by the server
            assert await slow[0].read() == b""
        for _, writer in (silent, slow):
            writer.close()
        async with g.client() as c:  # keep-alive requests that arrive promptly are not affected
            for _ in range(3):
                assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200


async def test_a_keep_alive_request_whose_head_stalls_or_trickles_is_disconnected(upstreams: StartUpstreams) -> None:
    """The head timer of a request after the first is armed only when a read leaves its head incomplete, and it
    runs from the head's start: a byte every 0.1 s does not hold the connection past ``header_timeout_s``."""
    (w,) = await upstreams(1)
    body = orjson.dumps(CHAT)
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + KEYS["alpha"].encode()
        + b"\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    )  # fmt: skip
    async with serve_gateway(make_fleet([w.url]), make_tenants(), header_timeout_s=0.3) as g:
        url = urlsplit(g.url)
        for trickle in (False, True):
            reader, writer = await asyncio.open_connection(url.hostname, url.port)
            writer.write(request)  # a whole request first: the connection's own timer is gone
            async with asyncio.timeout(5):
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200")
                await reader.readexactly(int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]))
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
            async with asyncio.timeout(5):  # closed by the server; a timer armed per read would keep it open
                while not reader.at_eof():
                    if trickle:
                        writer.write(b"x")
                    await asyncio.sleep(0.1)
            writer.close()


async def test_large_bodies_are_not_counted_as_head(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants(), max_header_bytes=1024) as g, g.client() as c:
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 2_000_000}]}
        r = await c.post("/v1/chat/completions", json=big)
        assert r.status_code == 200, r.text
        assert len(w.bodies[-1]["messages"][0]["content"]) == 2_000_000
