"""Prefix affinity in the gateway: the hash chain of prompt blocks, the index with TTL, the scorer's load bound,
cached-token metering and pricing, and a live gateway in front of two simulated workers with prefix caches."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleet.config import FleetConfig, PricingConfig, SpeculationPreference, TierConfig, WorkerConfig
from fleet.store.protocol import WorkerState
from gateway.routing.context import RouteContext
from gateway.routing.pool import WorkerView
from gateway.routing.prefix import PrefixIndex, block_hashes, prompt_text, request_blocks
from gateway.routing.scorers.prefix import PrefixScorer
from gateway.settings import GatewaySettings
from gateway.upstream.sse import StreamMeter, usage_of
from gateway.usage.metering import request_cost
from tests.sims import sim_servers
from workers.sim.server import SimServer

from .harness import MODEL, make_fleet, make_router, make_tenants, serve_gateway

S = GatewaySettings()
BLOCKS = {"block_chars": S.prefix_block_chars, "max_blocks": S.prefix_max_blocks}
"""The settings' block size and count."""
PER_SLOT = S.prefill_tokens_per_slot

TIER = TierConfig(speculation=SpeculationPreference.NEUTRAL)
SYSTEM = "You are a careful coding agent; read before you write. " * 40


def _chat(*turns: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return {"model": MODEL, "messages": messages}


def _blocks(body: dict[str, Any], **kw: int) -> tuple[int, ...]:
    return block_hashes(prompt_text(body, chat="messages" in body), **{**BLOCKS, **kw})


# ------------------------------------------------------------------------------------------ hash chain
def test_a_next_turn_shares_the_previous_turns_blocks_and_only_full_blocks_count() -> None:
    first = _blocks(_chat("Fix the parser."), block_chars=256)
    second = _blocks(_chat("Fix the parser.", "Reading parser.py now. " * 30, "Go on."), block_chars=256)
    assert len(first) == len(prompt_text(_chat("Fix the parser."), chat=True)) // 256
    assert second[: len(first)] == first
    assert len(second) > len(first)
    changed = _chat("Fix the parser.")
    changed["messages"][0]["content"] = "X" + SYSTEM
    assert _blocks(changed, block_chars=256)[0] != first[0]  # a chain: a different beginning changes every block
    assert set(_blocks(changed, block_chars=256)).isdisjoint(first)
    assert _blocks(_chat("Fix the parser."), block_chars=256, max_blocks=3) == first[:3]
    assert _blocks({"messages": [{"role": "user", "content": "short"}]}) == ()


def test_tools_and_tool_calls_are_part_of_the_prefix_and_a_batch_of_prompts_has_none() -> None:
    body = _chat("Run the tests.")
    tool = {"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}
    with_tools = {**body, "tools": [tool]}
    assert prompt_text(with_tools, chat=True).startswith('[{"type":"function"')
    assert _blocks(with_tools)[0] != _blocks(body)[0]
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"name": "run"}}]}
    assert '"name":"run"' in prompt_text({"messages": [call]}, chat=True)
    assert prompt_text({"prompt": ["a" * 600, "b" * 600]}, chat=False) == ""
    text = "word " * 300
    assert request_blocks({"prompt": text}, chat=False, block_chars=512, max_blocks=8) == block_hashes(
        text, block_chars=512, max_blocks=8
    )


# --------------------------------------------------------------------------------------------- index
def test_the_index_counts_leading_blocks_per_worker_within_the_ttl() -> None:
    index = PrefixIndex(ttl_s=10.0, capacity=100)
    index.record((1, 2, 3), "a", now=100.0)
    index.record((1, 2), "b", now=105.0)
    assert index.matches((1, 2, 3, 4), ["a", "b", "c"], now=106.0) == {"a": 3, "b": 2, "c": 0}
    assert index.matches((9, 10, 11), ["a"], now=106.0) == {"a": 0}
    assert index.matches((1, 2, 3), ["a", "b"], now=111.0) == {"a": 0, "b": 2}  # a's entries are past the TTL


def test_the_index_keeps_at_most_capacity_hashes_least_recently_used_out() -> None:
    index = PrefixIndex(ttl_s=60.0, capacity=4)
    index.record((1, 2, 3), "a", now=0.0)
    index.record((1,), "b", now=1.0)  # 1 is used again: 2 is now the oldest
    index.record((7, 8), "c", now=2.0)
    assert len(index) == 4  # a's deepest blocks went first: a prefix outlives its tail
    assert index.matches((1, 2, 3), ["a", "b"], now=3.0) == {"a": 1, "b": 1}
    assert index.matches((7, 8), ["c"], now=3.0) == {"c": 2}


# -------------------------------------------------------------------------------------------- scorer
def _state(**fields: Any) -> WorkerState:
    return WorkerState(worker_id="w0", model=MODEL, k_desired=0, k_applied=0, accepted_length=1.0, **fields)


def _views(*loads: int) -> list[WorkerView]:
    return [
        WorkerView(config=WorkerConfig(id=f"w{i}", url=f"http://127.0.0.1:{9000 + i}", model=MODEL), in_flight=n)
        for i, n in enumerate(loads)
    ]


async def test_the_scorer_follows_the_prefix_while_the_worker_is_within_the_load_bound() -> None:
    index = PrefixIndex(ttl_s=60.0, capacity=1000)
    blocks = (11, 12, 13, 14)
    index.record(blocks[:3], "w0", now=0.0)
    scorer = PrefixScorer(index, load_factor=2.0, prefill_tokens_per_slot=PER_SLOT)
    ctx = RouteContext(model=MODEL, tier=TIER, now=1.0, prefix_blocks=blocks)
    assert await scorer(ctx, _views(0, 0)) == [0.75, 0.0]
    assert await scorer(ctx, _views(4, 1)) == [0.75, 0.0]  # 4 ≤ 2 × (1 + 1)
    assert await scorer(ctx, _views(5, 1)) == [0.0, 0.0]  # beyond the bound: affinity gives way
    state = _state(running=9.0)
    busy = _views(0, 1)
    busy[0].state = state  # published load counts too
    assert await scorer(ctx, busy) == [0.0, 0.0]
    assert await scorer(RouteContext(model=MODEL, tier=TIER, now=1.0), _views(0, 0)) == [0.0, 0.0]


async def test_a_hot_prefix_spreads_over_the_workers_instead_of_pinning_one() -> None:
    index = PrefixIndex(ttl_s=60.0, capacity=1000)
    fleet = make_fleet([f"http://127.0.0.1:{9000 + i}" for i in range(3)])
    router = make_router(fleet, weight_kv=0.0, weight_speculation=0.0, prefix=index, prefix_load_factor=2.0)
    views = _views(0, 0, 0)
    hot = (1, 2, 3, 4)
    for _ in range(30):  # 30 concurrent requests sharing one prefix, none finishing
        ctx = RouteContext(model=MODEL, tier=TIER, now=1.0, prefix_blocks=hot)
        chosen = (await router.route(ctx, views)).ranked[0]
        chosen.in_flight += 1
        index.record(hot, chosen.id, now=1.0)
    loads = sorted(v.in_flight for v in views)
    assert loads[-1] <= 2 * (loads[0] + 1)
    free_index = PrefixIndex(ttl_s=60.0, capacity=1000)
    unbounded = make_router(fleet, weight_kv=0.0, weight_speculation=0.0, prefix=free_index, prefix_load_factor=1e9)
    views = _views(0, 0, 0)
    for _ in range(30):
        ctx = RouteContext(model=MODEL, tier=TIER, now=1.0, prefix_blocks=hot)
        chosen = (await unbounded.route(ctx, views)).ranked[0]
        chosen.in_flight += 1
        free_index.record(hot, chosen.id, now=1.0)
    assert max(v.in_flight for v in views) == 30  # what the bound prevents


# ----------------------------------------------------------------------------------- metering, pricing
def test_cached_tokens_are_read_from_the_usage_block_of_responses_and_streams() -> None:
    usage = usage_of(
        {"usage": {"prompt_tokens": 900, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 768}}}
    )
    assert usage is not None
    assert (usage.prompt_tokens, usage.cached_tokens) == (900, 768)
    nulls = usage_of({"usage": {"prompt_tokens": 9, "completion_tokens": 1, "prompt_tokens_details": None}})
    assert nulls is not None
    assert nulls.cached_tokens == 0
    meter = StreamMeter(strip_usage=True)
    usage_chunk = {
        "choices": [],
        "usage": {"prompt_tokens": 50, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 32}},
    }
    final = b"data: " + orjson.dumps(usage_chunk) + b"\n\n"
    assert meter.feed(final, 1.0) == b""
    assert meter.usage is not None
    assert meter.usage.cached_tokens == 32


def test_cached_prompt_tokens_are_priced_at_the_discount() -> None:
    view = _views(0)[0]
    view.state = _state(usd_per_mtok=2.0)
    pricing = PricingConfig(prompt_usd_per_mtok=1.0, cached_prompt_discount=0.9)
    cost = request_cost(
        view, completion_tokens=1000, busy_s=1.0, concurrent=1, prompt_tokens=10_000, cached_tokens=8000,
        pricing=pricing,
    )  # fmt: skip
    assert cost == pytest.approx(1000 * 2.0 / 1e6 + 2000 * 1.0 / 1e6 + 8000 * 0.1 / 1e6)
    assert request_cost(view, completion_tokens=1000, busy_s=1.0, concurrent=1) == pytest.approx(0.002)
    with pytest.raises(ValueError, match="cached_prompt_discount"):
        FleetConfig.model_validate(
            {"models": [{"name": MODEL, "pricing": {"cached_prompt_discount": 1.5}}], "workers": []}
        )


# ---------------------------------------------------------------------------------------- live gateway
@pytest.fixture
async def sims() -> AsyncIterator[list[SimServer]]:
    async with sim_servers(2, model=MODEL, speedup=500.0) as servers:
        yield servers


def _hits(text: str) -> float:
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name == "vllm:prefix_cache_hits_total":
                return float(sample.value)
    raise KeyError("vllm:prefix_cache_hits_total")


async def _session(c: httpx.AsyncClient, name: str, turns: int) -> list[dict[str, Any]]:
    """One multi-turn chat, each turn sent after the previous answer; the usage of each turn."""
    messages = [{"role": "system", "content": f"Session {name}. " + SYSTEM}]
    usages = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Step {turn}: carry on with the task. " * 5})
        body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0, "stream": turn % 2 == 1,
                "stream_options": {"include_usage": True} if turn % 2 == 1 else None}  # fmt: skip
        if not body["stream"]:
            del body["stream_options"]
            r = await c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            usages.append(r.json()["usage"])
            answer = r.json()["choices"][0]["message"]["content"]
        else:
            answer, usage = "", None
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        chunk = orjson.loads(line[6:])
                        if chunk["choices"]:
                            answer += chunk["choices"][0]["delta"].get("content") or ""
                        usage = chunk.get("usage") or usage
            usages.append(usage)
        messages.append({"role": "assistant", "content": answer})
    return usages


async def _arm(
    sims: list[SimServer], *, weight_prefix: float, tag: str
) -> tuple[list[Any], dict[str, Any], float, str]:
    """Four sessions of four turns, one request at a time; (ledger records, usages by session, the workers'
    prefix-cache hits gained, the gateway's /metrics)."""
    fleet = make_fleet([s.url for s in sims])
    async with httpx.AsyncClient() as h:
        before = sum([_hits((await h.get(f"{s.url}/metrics")).text) for s in sims])
        async with serve_gateway(fleet, make_tenants(alpha={"rpm": 1000}), weight_prefix=weight_prefix) as g:
            async with g.client() as c:
                usages = {name: await _session(c, f"{tag}-{name}", 4) for name in "abcd"}
                await g.gw.ledger.idle()
                metrics = (await c.get("/metrics")).text
            records = await g.store.ledger(since=0.0, until=1e12)
        after = sum([_hits((await h.get(f"{s.url}/metrics")).text) for s in sims])
    return records, usages, after - before, metrics


async def test_sessions_stick_to_their_worker_and_the_cached_tokens_are_metered(sims: list[SimServer]) -> None:
    records, usages, hits, metrics = await _arm(sims, weight_prefix=2.0, tag="on")
    assert len(records) == 16
    by_request = sorted(records, key=lambda r: r.at)
    workers_of = {name: {r.worker_id for r in by_request[4 * i : 4 * i + 4]} for i, name in enumerate("abcd")}
    assert all(len(w) == 1 for w in workers_of.values()), workers_of
    for name, turns in usages.items():
        assert turns[0]["prompt_tokens_details"]["cached_tokens"] == 0
        for previous, usage in itertools.pairwise(turns):
            assert usage["prompt_tokens_details"]["cached_tokens"] == (previous["prompt_tokens"] - 3) // 16 * 16, name
    cached = sum(r.cached_tokens for r in records)
    assert cached == sum(u["prompt_tokens_details"]["cached_tokens"] for t in usages.values() for u in t)
    assert cached == hits
    assert _metric(metrics, "gearshift_gateway_tokens_total", kind="cached_prompt") == cached
    off_records, _, off_hits, _ = await _arm(sims, weight_prefix=0.0, tag="off")
    assert len({r.worker_id for r in off_records}) == 2
    assert off_hits < hits  # without affinity, a turn finds its prefix only where chance sends it


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total
