"""The gateway bench's parts: the fake upstream on loopback, wrk's summary line, py-spy's collapsed stacks, the
Redis command mix (``MONITOR`` on a real Redis) and the tenant's limits as the report states them."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import redis

from bench.gateway import upstream
from bench.gateway.commands import Monitor
from bench.gateway.gearshift_target import bench_tenants, limits_note
from bench.gateway.profile import LOOP_ITSELF, component_of, summarise
from bench.gateway.wrk import chat_body, parse_output
from bench.procs import ProcessFailed, start_redis
from fleet.store import lua


@pytest.fixture
async def upstream_url() -> AsyncIterator[str]:
    sock = socket.create_server(("127.0.0.1", 0))
    server = await upstream.serve(sock)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


async def test_upstream_answers_json_with_usage(upstream_url: str) -> None:
    async with (
        aiohttp.ClientSession() as s,
        s.post(upstream_url + "/v1/chat/completions", data=chat_body(stream=False)) as r,
    ):
        body = await r.json()
    assert r.status == 200
    assert body["usage"]["completion_tokens"] == upstream.STREAM_CHUNKS


async def test_upstream_streams_32_chunks_usage_and_done(upstream_url: str) -> None:
    async with (
        aiohttp.ClientSession() as s,
        s.post(upstream_url + "/v1/chat/completions", data=chat_body(stream=True)) as r,
    ):
        text = (await r.read()).decode()
    events = [e for e in text.split("\n\n") if e]
    assert r.headers["content-type"] == "text/event-stream"
    assert len(events) == upstream.STREAM_CHUNKS + 2
    assert '"usage"' in events[-2]
    assert events[-1] == "data: [DONE]"


async def test_upstream_keeps_the_connection_alive(upstream_url: str) -> None:
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as s:
        for path in ("/health", "/v1/models", "/metrics", "/nope"):
            async with s.get(upstream_url + path) as r:
                await r.read()
                assert r.status == (404 if path == "/nope" else 200)


def test_parse_wrk_summary() -> None:
    out = (
        "Running 1s test\n"
        'GEARSHIFT_BENCH_JSON {"requests": 2000, "duration_us": 1000000, "bytes": 1, "errors_connect": 0, '
        '"errors_read": 1, "errors_write": 0, "errors_status": 2, "errors_timeout": 0, "p50_us": 400, '
        '"p90_us": 700, "p99_us": 1500, "mean_us": 450.5, "max_us": 9000}\n'
    )
    r = parse_output(out)
    assert r.requests_per_s == 2000
    assert r.errors == 3
    assert r.p99_us == 1500


def test_parse_wrk_without_summary_is_an_error() -> None:
    with pytest.raises(ProcessFailed, match="no summary line"):
        parse_output("wrk: connection refused")


def test_profile_summary_shares() -> None:
    root = "<module> (bench/gateway/passthrough.py:80);Runner.run (asyncio/runners.py:118)"
    raw = "\n".join(
        [
            f"{root};handle (gateway/pipeline.py:10);send (aiohttp/client.py:5) 30",
            f"{root};handle (gateway/pipeline.py:10) 10",
            f"{root} 10",
            "Thread._bootstrap (threading.py:1002);Queue.get (queue.py:171);Condition.wait (threading.py:327) 500",
        ]
    )
    p = summarise(raw, target="t", expected_samples=100)
    assert p.samples == 50
    assert p.idle_share == pytest.approx(0.5)
    assert p.inclusive["gateway (gearshift)"] == pytest.approx(0.8)
    assert p.inclusive["aiohttp (upstream client)"] == pytest.approx(0.6)
    assert p.inclusive[LOOP_ITSELF] == pytest.approx(0.2)
    assert "bench pass-through / launcher" not in p.inclusive  # frames below the event loop are left out
    assert p.top_self[0][0] == "send (aiohttp/client.py:5)"
    assert p.top_self[0][1] == pytest.approx(0.6)
    assert component_of("bench/gateway/passthrough.py") == "bench pass-through / launcher"
    assert component_of("/work/main/gateway/app.py") == "gateway (gearshift)"


@pytest.mark.redis
def test_the_command_mix_names_each_script_call_and_leaves_out_what_scripts_run(tmp_path: Path) -> None:
    server = start_redis(log_dir=tmp_path)
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        sha = client.script_load(lua.EJECTED)
        bundle = client.script_load(lua.BUNDLE)
        with Monitor(server.port) as monitor:
            for _ in range(3):
                client.evalsha(sha, 1, "{ejected}:until", "0")  # two commands inside the script each time
            client.evalsha(bundle, 1, "{ejected}:until", "1", lua.BUNDLE_INDEX["ejected"], "1", "1", "0")
            client.set("k", "v")
            client.get("k")
    finally:
        client.close()
        server.stop()
    assert dict(monitor.counts) == {"evalsha:ejected": 3, "evalsha:bundle": 1, "set": 1, "get": 1}


def test_the_report_states_which_limits_are_leased_and_which_exact() -> None:
    (tenant,) = bench_tenants("").tenants
    note = "\n".join(limits_note())
    assert f"Concurrency {tenant.max_concurrency:,}: **exact**" in note
    for what in ("RPM", "TPM", "Budget"):
        assert f"- {what} " in note
    assert note.count("**leased**") == 3
    assert f"{int((tenant.rpm or 0) * 0.005 / 2):,} requests" in "\n".join(limits_note(workers=2))
