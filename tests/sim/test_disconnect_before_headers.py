"""A client that vanishes before a stream's headers are written (it sends its request and resets the connection at
once) is a quiet abort: no traceback in the worker's log, its engine requests dropped, the engine idle again and
each request counted once as finished."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from workers.sim.server import SimServer

from .conftest import sim_settings

MAX_TOKENS = 20_000
"""Far more than the engine produces in the test's few seconds, so a request left running shows."""
BODIES = {
    "/v1/completions": {"prompt": "long", "max_tokens": MAX_TOKENS, "stream": True},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "x"}], "max_tokens": MAX_TOKENS, "stream": True},
    "/v1/responses": {"input": "x", "max_output_tokens": MAX_TOKENS, "stream": True},
}
PER_ROUTE = 3


def _send_and_reset(host: str, port: int, path: str, body: dict[str, object]) -> None:
    """POST ``body`` and close with a TCP reset (linger 0) before reading anything."""
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(head.encode() + data)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _samples(text: str) -> dict[str, float]:
    return {
        s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples if not s.labels.get("le")
    }


async def test_a_client_gone_before_the_headers_is_a_quiet_abort(caplog: pytest.LogCaptureFixture) -> None:
    server = SimServer(sim_settings(speedup=5))
    await server.start()
    caplog.set_level(logging.WARNING)
    try:
        host, port = server.url.removeprefix("http://").split(":")
        for path, body in BODIES.items():
            for _ in range(PER_ROUTE):
                await asyncio.to_thread(_send_and_reset, host, int(port), path, body)
        async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
            metrics: dict[str, float] = {}
            for _ in range(100):  # up to 10 s
                metrics = _samples((await client.get("/metrics")).text)
                idle = metrics["vllm:num_requests_running"] == metrics["vllm:num_requests_waiting"] == 0
                if idle and metrics["vllm:e2e_request_latency_seconds_count"] > 0:
                    break
                await asyncio.sleep(0.1)
    finally:
        await server.stop()
    assert metrics["vllm:num_requests_running"] == 0, "a vanished client's request is aborted"
    assert metrics["vllm:num_requests_waiting"] == 0
    assert metrics["vllm:kv_cache_usage_perc"] == 0
    assert metrics["vllm:generation_tokens_total"] < MAX_TOKENS
    finished = metrics["vllm:e2e_request_latency_seconds_count"]
    assert 0 < finished <= len(BODIES) * PER_ROUTE, "the requests reached the engine, each finished once"
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not noisy, [f"{r.name}: {r.getMessage()}" for r in noisy]
