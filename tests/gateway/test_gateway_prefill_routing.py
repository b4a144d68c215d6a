"""Routing sees outstanding prefill work: a worker busy prefilling a long prompt looks loaded."""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest

from fleet.config import SpeculationPreference, TierConfig
from gateway.routing.context import RouteContext
from gateway.routing.pool import WorkerView
from gateway.routing.scorers.queue import QueueScorer

from .harness import MODEL, Mode, StartUpstreams, eventually, make_fleet, make_router, make_tenants, serve_gateway

INTERACTIVE = TierConfig(priority=0, tpot_target_s=0.05, speculation=SpeculationPreference.SPEED)
CTX = RouteContext(model=MODEL, tier=INTERACTIVE, now=1000.0)


def two_workers() -> tuple[WorkerView, WorkerView]:
    fleet = make_fleet(["http://127.0.0.1:9000", "http://127.0.0.1:9001"])
    a, b = (WorkerView(config=w) for w in fleet.workers)
    return a, b


async def test_a_new_request_avoids_the_worker_prefilling_a_huge_prompt() -> None:
    busy, idle = two_workers()
    router = make_router(make_fleet([busy.config.url, idle.config.url]), rng=random.Random(1))
    busy.in_flight, idle.in_flight = 1, 2  # by request count alone `busy` is the less loaded one
    busy.prefill_tokens, idle.prefill_tokens = 150_000, 3_000
    decision = await router.route(CTX, [busy, idle])
    assert [w.id for w in decision.ranked] == [idle.id, busy.id]
    busy.prefill_tokens = 0  # prefill done: the request count decides again
    decision = await router.route(CTX, [busy, idle])
    assert [w.id for w in decision.ranked] == [busy.id, idle.id]


async def test_queue_score_counts_prompt_tokens_per_slot() -> None:
    a, b = two_workers()
    slots = a.config.max_num_seqs
    a.in_flight = 2
    a.prefill_tokens = 3 * 512
    scores = await QueueScorer(prefill_tokens_per_slot=512)(CTX, [a, b])
    assert scores == pytest.approx([slots / (slots + 5), 1.0])


def test_the_queue_scorer_rejects_a_bad_budget() -> None:
    with pytest.raises(ValueError, match="prefill_tokens_per_slot"):
        QueueScorer(prefill_tokens_per_slot=0)


async def test_the_live_gateway_counts_a_pending_prompt_as_prefill_until_the_first_byte(
    upstreams: StartUpstreams,
) -> None:
    (w,) = await upstreams(1, mode=Mode.HANG)
    prompt = "x" * 40_000  # ~10 000 tokens at 4 characters per token
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 4}
    async with serve_gateway(make_fleet([w.url]), make_tenants(), first_byte_timeout_s=30) as g:
        view = g.gw.pool.views["w0"]
        async with g.client(timeout=30) as c:
            pending = asyncio.create_task(c.post("/v1/chat/completions", json=body))

            async def prefilling() -> bool:
                return view.prefill_tokens >= 10_000

            await eventually(prefilling)
            w.mode = Mode.OK  # the hung request stays hung; cancel it and check the release
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pending

            async def released() -> bool:
                return view.prefill_tokens == 0 and view.in_flight == 0

            await eventually(released)
            assert (await c.post("/v1/chat/completions", json=body)).status_code == 200
        assert view.prefill_tokens == 0
