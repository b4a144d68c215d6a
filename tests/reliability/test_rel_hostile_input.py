"""Hostile input against a real gateway in front of a real simulated worker: oversized and deeply nested bodies,
too many messages, out-of-range ``max_tokens`` and ``n``, huge headers and slow clients. Every refusal must be
an OpenAI error object, and none may take the process down or starve other clients."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest

from bench.procs import Proc
from bench.soak.client import stream_chat
from bench.soak.probe import established
from tests.gateway.harness import eventually

from .rel_harness import KEYS, MODEL, LiveGateway, chat, fleet_of, live_gateway

LIMIT = 64 * 1024
AUTH = {"authorization": f"Bearer {KEYS['alpha']}", "content-type": "application/json"}


@pytest.fixture
async def gateway(shared_workers: list[Proc]) -> AsyncIterator[LiveGateway]:
    async with live_gateway(fleet_of([shared_workers[0].url]), max_body_bytes=LIMIT) as live:
        yield live


async def _post(live: LiveGateway, data: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(live.url + "/v1/chat/completions", data=data, headers={**AUTH, **(headers or {})}) as resp,
    ):
        body = await resp.json(content_type=None)
        return resp.status, body


def _is_openai_error(body: object) -> bool:
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return False
    return isinstance(body["error"].get("message"), str) and isinstance(body["error"].get("type"), str)


async def _still_serves(live: LiveGateway) -> None:
    async with aiohttp.ClientSession() as s:
        r = await stream_chat(s, live.url, key=KEYS["alpha"], body=chat(3))
    assert r.ok, r


async def test_body_over_the_limit_is_413_with_or_without_content_length(gateway: LiveGateway) -> None:
    big = b'{"model": "kimi-k3", "messages": [{"role": "user", "content": "' + b"x" * (2 * LIMIT) + b'"}]}'
    status, body = await _post(gateway, big)
    assert status == 413, body
    assert _is_openai_error(body), body

    async def chunked() -> AsyncIterator[bytes]:
        for i in range(0, len(big), 8192):
            yield big[i : i + 8192]

    async with (
        aiohttp.ClientSession() as s,
        s.post(gateway.url + "/v1/chat/completions", data=chunked(), headers=AUTH) as resp,
    ):
        assert resp.status == 413
        assert _is_openai_error(await resp.json(content_type=None))
    await _still_serves(gateway)


async def test_deeply_nested_json_is_a_400(gateway: LiveGateway) -> None:
    depth = 5000
    nested = b"[" * depth + b"]" * depth
    data = (
        b'{"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "x": ' + nested + b"}"
    )
    status, body = await _post(gateway, data)
    assert status == 400, body
    assert _is_openai_error(body), body
    await _still_serves(gateway)


async def test_too_many_messages_is_a_400(gateway: LiveGateway) -> None:
    many = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": ""}] * 1500}
    import orjson

    status, body = await _post(gateway, orjson.dumps(many))
    assert status == 400, (status, body)
    assert _is_openai_error(body), body
    assert "messages" in str(body)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", -1),
        ("max_tokens", 0),
        ("max_tokens", "many"),
        ("max_tokens", 2**80),
        ("max_tokens", 10**15),
        ("n", 0),
        ("n", 10**6),
        ("n", -3),
    ],
)
async def test_out_of_range_max_tokens_and_n_are_400(gateway: LiveGateway, field: str, value: object) -> None:
    import orjson

    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, field: value}
    try:
        data = orjson.dumps(body)
    except orjson.JSONEncodeError:  # integers beyond 64 bits: write the JSON text by hand
        data = orjson.dumps({**body, field: 0}).replace(f'"{field}":0'.encode(), f'"{field}":{value}'.encode())
    status, err = await _post(gateway, data)
    assert status == 400, (status, err)
    assert _is_openai_error(err), err
    await _still_serves(gateway)


@pytest.mark.parametrize("headers", [{"x-padding": "a" * 1_000_000}, {f"x-h{i}": "v" for i in range(5000)}])
async def test_huge_or_too_many_headers_are_refused_and_process_keeps_serving(
    gateway: LiveGateway, headers: dict[str, str]
) -> None:
    async with (
        aiohttp.ClientSession(max_line_size=2_000_000, max_field_size=2_000_000) as s,
        s.post(gateway.url + "/v1/chat/completions", json=chat(2), headers={**AUTH, **headers}) as resp,
    ):
        status, body = resp.status, await resp.json(content_type=None)
    await _still_serves(gateway)
    assert status == 431, status
    assert _is_openai_error(body), body


async def _slow_client(port: int, stop: asyncio.Event) -> bool:
    """Send a request line and then one header byte a second; True when the server closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        await writer.drain()
        while not stop.is_set():
            writer.write(b"X")
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    if await reader.read(1024) == b"":
                        return True
        return False
    except (ConnectionError, OSError):
        return True
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


async def test_slowloris_neither_starves_others_nor_holds_connections_forever(shared_workers: list[Proc]) -> None:
    async with live_gateway(fleet_of([shared_workers[0].url])) as live:
        port = live.port
        stop = asyncio.Event()
        slow = [asyncio.create_task(_slow_client(port, stop)) for _ in range(100)]
        await eventually(lambda: established(port) >= len(slow), timeout_s=10)
        await _still_serves(live)  # other clients are served while 100 slow clients hang on
        await asyncio.wait(slow, timeout=5)
        closed = sum(1 for t in slow if t.done() and t.result() is True)
        stop.set()
        await asyncio.gather(*slow, return_exceptions=True)
    assert closed == len(slow), f"{len(slow) - closed} of {len(slow)} slow connections were still open after 5 s"
