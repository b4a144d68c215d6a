"""``gearshift usage export`` (issue 17): the ledger, a page at a time through the admin API, as a replay trace."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

from bench.replay.trace import read_trace
from fleet.store.memory import MemoryStore
from fleet.store.protocol import UsageRecord
from gearshift.cli.usage import export, pages, parse_time

from .harness import (
    ADMIN_KEY,
    MODEL,
    StartUpstreams,
    eventually,
    make_fleet,
    make_settings,
    make_tenants,
    serve_gateway,
)

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5}


def _record(i: int, at: float) -> UsageRecord:
    return UsageRecord(
        request_id=f"r{i}", tenant="alpha", model=MODEL, worker_id="w0", prompt_tokens=3, completion_tokens=2,
        cost_usd=0.0, status="ok", at=at, arrived_at=at - 0.5,
    )  # fmt: skip


async def test_pages_give_every_record_once_across_equal_times_at_a_boundary() -> None:
    store = MemoryStore()
    times = [10.0, 11.0, 11.0, 11.0, 11.0, 12.0, 13.0]  # a page boundary falls inside the run of 11.0
    await store.append_usage_many([_record(i, t) for i, t in enumerate(times)])

    async def fetch(a: float, b: float, limit: int) -> list[UsageRecord]:
        return await store.ledger(since=a, until=b, limit=limit)

    got = [r.request_id async for r in pages(fetch, 0.0, 100.0, page_size=3)]
    assert got == [f"r{i}" for i in range(len(times))]
    same_instant = [r.request_id async for r in pages(fetch, 11.0, 12.0, page_size=2)]
    assert sorted(same_instant) == ["r1", "r2", "r3", "r4"]


def test_times_parse_from_seconds_iso_and_ago() -> None:
    assert parse_time("12.5", now=100.0) == 12.5
    assert parse_time("-1m", now=100.0) == 40.0
    assert parse_time("1970-01-01T00:01:00", now=0.0) == 60.0
    assert parse_time(None, now=1.0) is None


async def test_export_through_the_admin_api_is_a_trace_of_every_answered_request(
    upstreams: StartUpstreams, tmp_path: Path
) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g:
        async with g.client("alpha") as a, g.client("beta") as b:
            answers = await asyncio.gather(*(c.post("/v1/chat/completions", json=CHAT) for c in [a, b] * 9))
        assert all(r.status_code == 200 for r in answers)
        ids = {r.headers["x-request-id"] for r in answers}

        async def all_metered() -> bool:
            return len(await g.store.ledger(since=0, until=1e12, limit=100)) == len(ids)

        await eventually(all_metered)
        out = io.StringIO()
        settings = make_settings()
        n = await export(
            out, since=0.0, until=1e12, settings=settings, gateway_url=g.url, admin_key=ADMIN_KEY, page_size=4
        )
    assert n == len(ids)
    path = tmp_path / "trace.jsonl"
    path.write_text(out.getvalue())
    rows = [UsageRecord.model_validate_json(line) for line in out.getvalue().splitlines()]
    assert {r.request_id for r in rows} == ids
    assert {r.tier for r in rows} == {"interactive", "batch"}
    assert all(r.arrived_at is not None and r.arrived_at <= r.at for r in rows)
    trace = read_trace(path)
    assert trace.format == "ledger"
    assert len(trace.requests) == len(ids)
    assert {(r.tenant, r.tier) for r in trace.requests} == {("alpha", "interactive"), ("beta", "batch")}


async def test_the_session_header_is_kept_in_the_ledger_and_a_bad_one_refused(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, g.client("alpha") as c:
        ok = await c.post("/v1/chat/completions", json=CHAT, headers={"x-gearshift-session": "chat-42"})
        plain = await c.post("/v1/chat/completions", json=CHAT)
        bad = await c.post("/v1/chat/completions", json=CHAT, headers={"x-gearshift-session": "a b"})
        assert (ok.status_code, plain.status_code, bad.status_code) == (200, 200, 400)
        assert bad.json()["error"]["param"] == "x-gearshift-session"

        async def both_metered() -> bool:
            return len(await g.store.ledger(since=0, until=1e12)) == 2

        await eventually(both_metered)
        sessions = {r.request_id: r.session for r in await g.store.ledger(since=0, until=1e12)}
    assert sessions == {ok.headers["x-request-id"]: "chat-42", plain.headers["x-request-id"]: None}
