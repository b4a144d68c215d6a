"""The plugin on a real vLLM CPU engine: the schedule set over HTTP reaches the scheduler, and vLLM's own
counters prove it.

The server (one per session, shared with test_real_stack.py, see conftest; vLLM's default process layout)
serves a tiny random Llama with ngram speculation, k_max 4, table [[1, 8, 4]]. Decoded greedily the model
repeats itself, so ngram drafts are proposed and accepted at every position. What the counters can show
exactly: a draft never holds more than k tokens (vLLM's ngram proposer may propose fewer, when its match sits
near the end of the text), so with k the accepted-per-position counters stay 0 at positions ≥ k, position
k-1 is reached, mean draft length is ≤ k, and k = 1 makes every draft exactly one token long.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleet import vllm_metrics as names
from fleet.scrape import WorkerScrape
from fleet.speculation import SPECULATION_PATH
from workers.vllm.cpu_server import TINY_K_MAX, TINY_MAX_NUM_SEQS, RunningServer
from workers.vllm.measure import BatchResult, read_counters, run_batch

from .conftest import CONTROL_TOKEN

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

AUTH = {"Authorization": f"Bearer {CONTROL_TOKEN}"}
MODEL = "tiny"
REQUESTS = 4
MAX_TOKENS = 48
WAIT_S = 15.0


@pytest.fixture
async def client(vllm_server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=vllm_server.url, timeout=60.0) as c:
        yield c


async def state(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get(SPECULATION_PATH)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def put(client: httpx.AsyncClient, *, headers: dict[str, str] | None = AUTH, **body: Any) -> httpx.Response:
    if "version" not in body:
        body["version"] = (await state(client))["version"] + 1
    return await client.put(SPECULATION_PATH, json=body, headers=headers)


async def set_k(client: httpx.AsyncClient, k: int, *, lease_seconds: float = 300.0) -> None:
    response = await put(client, k=k, lease_seconds=lease_seconds, reason=f"test sets k={k}")
    assert response.status_code == 200, response.text
    assert response.json()["schedule"] == [[1, TINY_MAX_NUM_SEQS, k]]


async def greedy_batch(client: httpx.AsyncClient) -> BatchResult:
    batch = await run_batch(client, str(client.base_url), model=MODEL, requests=REQUESTS, max_tokens=MAX_TOKENS)
    assert batch.completion_tokens == REQUESTS * MAX_TOKENS
    return batch


def assert_drafts_bounded_by(counters: WorkerScrape, k: int) -> None:
    assert counters.drafts > 0, counters
    assert counters.draft_tokens <= k * counters.drafts, counters
    assert counters.longest_accepted_position == k - 1, counters


async def gearshift_metrics(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = (await client.get("/metrics")).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("gearshift_worker_spec")
        for s in family.samples
    }


def k_gauge(k_row: tuple[int, int]) -> tuple[str, tuple[tuple[str, str], ...]]:
    return (names.WORKER_SPEC_K, (("from_bs", str(k_row[0])), ("to_bs", str(k_row[1]))))


async def test_get_returns_the_start_up_schedule(client: httpx.AsyncClient) -> None:
    body = await state(client)
    start_up = [[1, TINY_MAX_NUM_SEQS, TINY_K_MAX]]
    assert body["schedule"] == start_up
    assert body["fallback_schedule"] == start_up
    assert (body["worker_id"], body["method"], body["k_max"]) == ("tiny-0", "ngram", TINY_K_MAX)
    assert body["lease_expires_at"] is None


async def test_start_up_k_drafts_up_to_k_max(client: httpx.AsyncClient) -> None:
    batch = await greedy_batch(client)
    assert_drafts_bounded_by(batch.counters, TINY_K_MAX)
    assert batch.counters.accepted > 0


async def test_put_k_2_bounds_every_draft_at_two_tokens(client: httpx.AsyncClient) -> None:
    await set_k(client, 2)
    batch = await greedy_batch(client)
    assert_drafts_bounded_by(batch.counters, 2)
    assert batch.counters.accepted_per_pos[2:] == (0.0,) * (TINY_K_MAX - 2)
    metrics = await gearshift_metrics(client)
    assert metrics[k_gauge((1, TINY_MAX_NUM_SEQS))] == 2
    assert metrics[(names.WORKER_SPEC_VERSION, ())] == (await state(client))["version"]


async def test_put_k_1_makes_every_draft_exactly_one_token(client: httpx.AsyncClient) -> None:
    await set_k(client, 1)
    counters = (await greedy_batch(client)).counters
    assert counters.drafts > 0
    assert counters.draft_tokens == counters.drafts
    assert counters.longest_accepted_position == 0


async def test_a_table_gives_each_batch_size_its_own_k(client: httpx.AsyncClient) -> None:
    table = [[1, 1, 1], [2, TINY_MAX_NUM_SEQS, 3]]
    response = await put(client, schedule=table, lease_seconds=300.0)
    assert response.status_code == 200, response.text
    alone = await run_batch(client, str(client.base_url), model=MODEL, requests=1, max_tokens=MAX_TOKENS)
    assert alone.counters.drafts > 0
    assert alone.counters.draft_tokens == alone.counters.drafts  # batch size 1 → k = 1
    # One request with four prompts: vLLM adds all four to the engine at once, so steps run at batch size 4
    # (down to 1 only while the last ones finish).
    before = await read_counters(client, str(client.base_url))
    prompts = [f"four at once {i}" for i in range(4)]
    body = {"model": MODEL, "prompt": prompts, "max_tokens": 96, "temperature": 0.0, "ignore_eos": True}
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 4 * 96
    assert_drafts_bounded_by(await read_counters(client, str(client.base_url)) - before, 3)


async def test_put_k_0_stops_drafting(client: httpx.AsyncClient) -> None:
    await set_k(client, 0)
    batch = await greedy_batch(client)
    assert batch.counters.drafts == 0
    assert batch.counters.draft_tokens == 0
    assert batch.counters.generation_tokens == REQUESTS * MAX_TOKENS


async def test_a_short_lease_expires_without_calls_and_k_max_returns(client: httpx.AsyncClient) -> None:
    before = (await gearshift_metrics(client)).get((f"{names.WORKER_SPEC_LEASE_EXPIRED}_total", ()), 0.0)
    await set_k(client, 1, lease_seconds=1.0)
    # No GET or PUT from here on: the API server's poller (or the engine's before-step check) must expire it.
    deadline = time.monotonic() + WAIT_S
    while True:
        metrics = await gearshift_metrics(client)
        if metrics.get((f"{names.WORKER_SPEC_LEASE_EXPIRED}_total", ()), 0.0) == before + 1:
            break
        assert time.monotonic() < deadline, f"lease did not expire within {WAIT_S} s: {metrics}"
        await asyncio.sleep(0.2)
    assert metrics[k_gauge((1, TINY_MAX_NUM_SEQS))] == TINY_K_MAX
    body = await state(client)
    assert body["schedule"] == body["fallback_schedule"] == [[1, TINY_MAX_NUM_SEQS, TINY_K_MAX]]
    assert body["lease_expires_at"] is None
    assert "lease expired" in body["reason"]
    assert_drafts_bounded_by((await greedy_batch(client)).counters, TINY_K_MAX)


async def test_a_bad_schedule_is_400_while_an_in_flight_stream_finishes(client: httpx.AsyncClient) -> None:
    await set_k(client, 2)
    applied = await state(client)
    stream_tokens = 160
    body = {"model": MODEL, "prompt": "a stream", "max_tokens": stream_tokens, "temperature": 0.0}
    body |= {"ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", "/v1/completions", json=body) as stream:
        assert stream.status_code == 200
        lines = stream.aiter_lines()
        first = await anext(lines)
        assert first.startswith("data: ")
        bad: list[dict[str, Any]] = [
            {"k": TINY_K_MAX + 1},
            {"schedule": [[1, 3, 2], [5, TINY_MAX_NUM_SEQS, 2]]},
            {"schedule": [[1, TINY_MAX_NUM_SEQS, -1]]},
        ]
        for update in bad:
            response = await put(client, **update)
            assert response.status_code == 400, response.text
            assert response.json()["error"]["message"].startswith("schedule[")
            assert response.json()["error"]["param"] == "schedule"
        rest = [line async for line in lines]
    events = [json.loads(line.removeprefix("data: ")) for line in [first, *rest] if line.startswith("data: {")]
    assert events[-1]["usage"]["completion_tokens"] == stream_tokens
    assert [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]] == ["length"]
    assert await state(client) == applied


async def test_put_without_the_control_token_is_401(client: httpx.AsyncClient) -> None:
    for headers in ({}, {"Authorization": "Bearer not-the-token"}):
        response = await put(client, headers=headers, k=1)
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "AuthenticationError"


async def test_an_older_version_is_409_and_changes_nothing(client: httpx.AsyncClient) -> None:
    await set_k(client, 3)
    applied = await state(client)
    response = await put(client, k=1, version=applied["version"] - 1)
    assert response.status_code == 409
    assert "older than the applied version" in response.json()["error"]["message"]
    assert (await state(client))["schedule"] == [[1, TINY_MAX_NUM_SEQS, 3]]
