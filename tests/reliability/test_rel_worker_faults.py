"""Worker faults behind a real gateway: simulated worker processes SIGKILLed before the first byte and
mid-stream, a hung worker (SIGSTOP: the kernel accepts, nothing answers), and a worker answering 500s or
garbage. Each test asserts what the client sees, what the gateway ejects, and where traffic goes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import httpx
import orjson
import pytest

from bench.chaos.proxy import ChaosProxy, Mode
from bench.soak.client import StreamResult, stream_chat
from fleet.store.protocol import Store, UsageRecord
from tests.gateway.harness import eventually

from .rel_harness import KEYS, chat, fleet_of, live_gateway, tenants_of
from .rel_types import StartSims


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _records(store: Store, tenant: str = "alpha") -> list[UsageRecord]:
    totals = await store.usage(tenant, since=0, until=time.time() + 60, limit=10_000)
    return list(totals.records)


async def test_worker_killed_before_first_byte_is_retried_and_client_sees_one_normal_response(
    sims: StartSims, http: aiohttp.ClientSession
) -> None:
    a, b = await sims(2)
    async with live_gateway(fleet_of([a.url, b.url]), first_byte_timeout_s=30.0) as live:
        a.pause()  # its socket still accepts; the requests sent to it wait for a first byte that never comes
        reqs = [asyncio.create_task(stream_chat(http, live.url, key=KEYS["alpha"], body=chat(8))) for _ in range(4)]
        await eventually(lambda: live.gw.pool.views["w0"].in_flight >= 1)
        a.kill()
        results = await asyncio.gather(*reqs)
        await live.gw.ledger.idle()
        records = await _records(live.store)
    for r in results:
        assert r.ok, r
        assert r.role_events == 1, "two responses were spliced into one stream"
        assert r.completion_tokens == 8
    retries = live.gw.metrics.upstream_retries.labels(worker="w1", cause="disconnect")._value.get()
    assert retries >= 1, "no request was retried after the kill"
    assert len(records) == 4
    assert {r.worker_id for r in records} == {"w1"}
    assert all(r.status == "ok" and r.completion_tokens == 8 for r in records)


async def test_worker_killed_mid_stream_ends_with_error_event_and_done_within_idle_timeout(
    sims: StartSims, http: aiohttp.ClientSession
) -> None:
    (a,) = await sims(1, speedup=1.0)
    idle = 5.0
    killed_at: list[float] = []

    def kill_after_some_tokens(r: StreamResult) -> None:
        if r.content_events >= 3 and not killed_at:
            a.kill()
            killed_at.append(time.monotonic())

    async with live_gateway(fleet_of([a.url]), idle_timeout_s=idle) as live:
        body = chat(5000, ignore_eos=True)
        r = await stream_chat(http, live.url, key=KEYS["alpha"], body=body, progress=kill_after_some_tokens)
        await live.gw.ledger.idle()
        records = await _records(live.store)
    assert killed_at, "the stream ended before the worker could be killed"
    assert r.status == 200
    assert r.error is not None, "the broken stream was silently truncated"
    assert r.error["type"] == "api_error"
    assert r.done, "no [DONE] after the error event"
    assert r.transport_error is None
    assert r.ended - killed_at[0] < idle
    assert [rec.status for rec in records] == ["error"]
    assert records[0].completion_tokens >= 2


async def test_hung_worker_times_out_is_ejected_and_traffic_moves(sims: StartSims, http: aiohttp.ClientSession) -> None:
    a, b = await sims(2)
    async with live_gateway(
        fleet_of([a.url, b.url]), first_byte_timeout_s=1.0, eject_after_failures=2, eject_for_s=600
    ) as live:
        a.pause()

        async def burst() -> list[StreamResult]:  # two at once: least-loaded routing sends one to each worker
            return list(await asyncio.gather(*(stream_chat(http, live.url, key=KEYS["alpha"], body=chat(4))
                                               for _ in range(2))))  # fmt: skip

        first = await burst() + await burst()
        ejected = await live.store.ejected(now=time.time())
        moved = await burst() + await burst()
        await live.gw.ledger.idle()
        records = await _records(live.store)
        timeouts = live.gw.metrics.upstream_retries.labels(worker="w1", cause="timeout")._value.get()
    assert all(r.ok for r in first + moved), [r.error_type for r in first + moved]
    assert timeouts >= 2
    assert "w0" in ejected
    assert live.gw.metrics.ejections.labels(worker="w0")._value.get() == 1
    assert {rec.worker_id for rec in records} == {"w1"}
    assert all(r.ttft_s is not None and r.ttft_s < 1.0 for r in moved), "traffic still waited on the hung worker"


async def test_worker_answering_500s_is_ejected_and_recovers_after_it_heals(
    sims: StartSims, http: aiohttp.ClientSession
) -> None:
    a, b = await sims(2)
    chaos = await ChaosProxy(a.url).start()
    try:
        async with live_gateway(fleet_of([chaos.url, b.url]), eject_after_failures=2, eject_for_s=1.0) as live:
            chaos.mode = Mode.HTTP_500
            during = []
            for _ in range(3):
                during += await asyncio.gather(*(stream_chat(http, live.url, key=KEYS["alpha"], body=chat(4))
                                                 for _ in range(2)))  # fmt: skip
            assert all(r.ok for r in during), [r.error_type for r in during]
            assert live.gw.metrics.ejections.labels(worker="w0")._value.get() >= 1
            chaos.mode = Mode.OK
            healed_at = time.time()

            async def w0_serves_again() -> bool:
                rs = await asyncio.gather(*(stream_chat(http, live.url, key=KEYS["alpha"], body=chat(2))
                                            for _ in range(2)))  # fmt: skip
                assert all(r.ok for r in rs), [r.error_type for r in rs]
                await live.gw.ledger.idle()
                return any(r.worker_id == "w0" and r.at >= healed_at for r in await _records(live.store))

            await eventually(w0_serves_again, timeout_s=10)
    finally:
        await chaos.stop()


async def test_worker_answering_garbage_gets_error_events_then_is_ejected(
    sims: StartSims, http: aiohttp.ClientSession
) -> None:
    a, b = await sims(2)
    chaos = await ChaosProxy(a.url).start()
    try:
        async with live_gateway(fleet_of([chaos.url, b.url]), eject_after_failures=2, eject_for_s=600) as live:
            chaos.mode = Mode.GARBAGE
            results = []
            for _ in range(4):
                results += await asyncio.gather(*(stream_chat(http, live.url, key=KEYS["alpha"], body=chat(4))
                                                  for _ in range(2)))  # fmt: skip
            after = await asyncio.gather(*(stream_chat(http, live.url, key=KEYS["alpha"], body=chat(4))
                                           for _ in range(4)))  # fmt: skip
    finally:
        await chaos.stop()
    bad = [r for r in results if not r.ok]
    assert 1 <= len(bad) <= 2, [r.error_type for r in results]
    for r in bad:  # garbage after a 200 cannot be retried: it must end as an OpenAI error event and [DONE]
        assert r.status == 200
        assert r.error is not None
        assert r.error.get("type") == "api_error", r.error
        assert r.done
    assert all(r.ok for r in after), [r.error_type for r in after]


def _running(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith("vllm:num_requests_running"))


async def test_client_disconnect_frees_the_worker_the_slot_and_is_metered_as_cancelled(sims: StartSims) -> None:
    (w,) = await sims(1, speedup=1.0)
    tenants = tenants_of(alpha={"max_concurrency": 1})
    async with live_gateway(fleet_of([w.url]), tenants) as live:
        for _ in range(2):  # each abandoned stream must free the tenant's only concurrency slot
            reader, writer = await asyncio.open_connection("127.0.0.1", live.port)
            body = orjson.dumps({**chat(5000, ignore_eos=True), "stream": True})
            head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEYS['alpha']}\r\n"
                    f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n")  # fmt: skip
            writer.write(head.encode() + body)
            assert b"200 OK" in await reader.readuntil(b"\r\n\r\n")
            await reader.readuntil(b"\n\n")  # the first event: the worker is generating
            writer.close()
            await eventually(lambda: _running(w.url) == 0, timeout_s=5)
            await eventually(lambda: live.gw.pool.views["w0"].in_flight == 0, timeout_s=5)
        async with aiohttp.ClientSession() as s:
            assert (await stream_chat(s, live.url, key=KEYS["alpha"], body=chat(3))).ok
        await live.gw.ledger.idle()
        records = await _records(live.store)
    assert [r.status for r in records] == ["cancelled"] * 2 + ["ok"]
