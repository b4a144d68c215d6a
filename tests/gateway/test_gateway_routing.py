"""Routing: filter → weighted score → pick, in units and through the gateway with published worker state."""

from __future__ import annotations

import random
from typing import Any

import pytest

from fleet.config import SpeculationPreference, TierConfig
from fleet.store.protocol import WorkerState
from gateway.routing.context import RouteContext
from gateway.routing.pool import WorkerView
from gateway.routing.scorers.kv_cache import KvCacheScorer
from gateway.routing.scorers.queue import QueueScorer
from gateway.routing.scorers.speculation import SpeculationScorer
from gateway.settings import GatewaySettings

from .harness import MODEL, StartUpstreams, eventually, make_fleet, make_router, make_tenants, serve_gateway

PER_SLOT = GatewaySettings().prefill_tokens_per_slot
FLEET = make_fleet([f"http://127.0.0.1:{9000 + i}" for i in range(8)])
"""Room for the workers of ``views`` (the router's TTFT rates are per worker id)."""
QUEUE = QueueScorer(prefill_tokens_per_slot=PER_SLOT)
SPECULATION = SpeculationScorer(prefill_tokens_per_slot=PER_SLOT)

FAST = {"k_desired": 8, "k_applied": 8, "accepted_length": 5.0, "tpot_predicted_s": 0.012, "running": 2,
        "kv_usage": 0.1, "usd_per_mtok": 2.0}  # fmt: skip
"""A worker in a high gear at a small batch: fast per user, dearer per token."""
BULK = {"k_desired": 2, "k_applied": 2, "accepted_length": 1.8, "tpot_predicted_s": 0.04, "running": 48,
        "kv_usage": 0.55, "usd_per_mtok": 0.8}  # fmt: skip
"""A worker in a low gear at a large batch: slower per user, cheaper per token."""

INTERACTIVE = TierConfig(priority=0, tpot_target_s=0.05, speculation=SpeculationPreference.SPEED)
BATCH = TierConfig(priority=10, speculation=SpeculationPreference.THROUGHPUT)


def views(*states: dict[str, Any] | None) -> list[WorkerView]:
    fleet = make_fleet([f"http://127.0.0.1:{9000 + i}" for i in range(len(states))])
    return [
        WorkerView(config=w, state=WorkerState(worker_id=w.id, model=MODEL, **s) if s is not None else None)
        for w, s in zip(fleet.workers, states, strict=True)
    ]


def ctx(tier: TierConfig) -> RouteContext:
    return RouteContext(model=MODEL, tier=tier, now=1000.0)


async def test_queue_scorer_is_batch_slots_over_slots_plus_load() -> None:
    fast, bulk = views(FAST, BULK)
    bulk.in_flight = 60  # our own count beats a stale published one
    assert await QUEUE(ctx(BATCH), [fast, bulk]) == pytest.approx([64 / (64 + 2), 64 / (64 + 60)])


async def test_queue_scorer_still_ranks_workers_past_a_full_batch() -> None:
    """Far past a full batch (a burst of long prompts) one more request still lowers the score."""
    a, b = views(None, None)
    a.in_flight, b.in_flight = 640, 641
    a_score, b_score = await QUEUE(ctx(BATCH), [a, b])
    assert a_score > b_score > 0


async def test_kv_scorer() -> None:
    assert await KvCacheScorer()(ctx(BATCH), views(FAST, None)) == pytest.approx([0.9, 1.0])


async def test_speculation_scorer_by_preference() -> None:
    ws = views(FAST, BULK, None)
    speed = await SPECULATION(ctx(INTERACTIVE), ws)
    assert speed == pytest.approx([1.0, 0.012 / 0.04, 0.5])
    assert await SPECULATION(ctx(BATCH), ws[:2]) == pytest.approx([0.8 / 2.0, 1.0])
    no_cost = views({**FAST, "usd_per_mtok": None}, {**BULK, "usd_per_mtok": None})
    assert await SPECULATION(ctx(BATCH), no_cost) == pytest.approx([0.0, 1 - 2 / 8])
    neutral = TierConfig(speculation=SpeculationPreference.NEUTRAL)
    assert await SPECULATION(ctx(neutral), ws) == [0.5, 0.5, 0.5]
    flagged = views(FAST, {**BULK, "overloaded": True})
    assert await SPECULATION(ctx(neutral), flagged) == [0.5, 0.5], "no preference: load alone places it"


async def test_speed_score_falls_with_the_load_routed_since_the_publish() -> None:
    """A burst lands within one tick: the worker sent more than its published load loses its speed edge."""
    fast, other = views(FAST, {**FAST, "tpot_predicted_s": 0.015})
    before = await SPECULATION(ctx(INTERACTIVE), [fast, other])
    assert before[0] > before[1]
    fast.in_flight, fast.prefill_tokens = 6, 2048  # published running 2: 4 requests and 2 slots of prefill since
    after = await SPECULATION(ctx(INTERACTIVE), [fast, other])
    assert after == pytest.approx([(1 + 2) / (1 + 6 + 2), before[1]])
    assert after[0] < after[1]


async def test_speed_score_is_penalised_past_the_tpot_target_and_zero_when_overloaded() -> None:
    slow = {**BULK, "tpot_predicted_s": 0.1}
    scores = await SPECULATION(ctx(INTERACTIVE), views(FAST, slow, {**FAST, "overloaded": True}))
    assert scores == pytest.approx([1.0, (0.012 / 0.1) * (0.05 / 0.1), 0.0])


async def test_router_filters_and_ranks() -> None:
    router = make_router(FLEET, rng=random.Random(1))
    fast, bulk, down, ejected, other = views(FAST, BULK, FAST, FAST, FAST)
    down.healthy = False
    ejected.ejected_until = 2000.0
    object.__setattr__(other, "config", other.config.model_copy(update={"model": "other-model"}))
    decision = await router.route(ctx(INTERACTIVE), [fast, bulk, down, ejected, other])
    assert [w.id for w in decision.ranked] == ["w0", "w1"]
    assert decision.filtered_out == {"w2": "healthy", "w3": "not-ejected", "w4": "model"}
    decision = await router.route(ctx(BATCH), [fast, bulk])
    assert [w.id for w in decision.ranked] == ["w1", "w0"]


async def test_without_published_state_routes_to_the_least_loaded() -> None:
    router = make_router(FLEET)
    a, b = views(None, None)
    a.in_flight = 3
    for tier in (INTERACTIVE, BATCH):
        assert [w.id for w in (await router.route(ctx(tier), [a, b])).ranked] == ["w1", "w0"]


async def test_tiers_land_where_the_policy_says_through_the_gateway(upstreams: StartUpstreams) -> None:
    fast, bulk = await upstreams(2)
    async with serve_gateway(make_fleet([fast.url, bulk.url]), make_tenants()) as g:
        for worker_id, state in (("w0", FAST), ("w1", BULK)):
            await g.store.publish_worker_state(WorkerState(worker_id=worker_id, model=MODEL, **state), ttl_s=60)

        async def states_seen() -> bool:
            return all(v.state is not None for v in g.gw.pool.views.values())

        await eventually(states_seen)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        async with g.client("alpha") as interactive, g.client("beta") as batch:
            for _ in range(4):
                assert (await interactive.post("/v1/chat/completions", json=body)).status_code == 200
                assert (await batch.post("/v1/chat/completions", json=body)).status_code == 200
        assert [b["priority"] for b in fast.bodies] == [0] * 4
        assert [b["priority"] for b in bulk.bodies] == [10] * 4
        await g.gw.ledger.idle()
        records = (await g.store.usage("alpha", since=0, until=1e12)).records
        assert {r.worker_id for r in records} == {"w0"}
        # the controller's published cost per token prices the request: 2 tokens at 2 USD/Mtok
        assert records[0].cost_usd == pytest.approx(2 * 2.0 / 1e6)


async def test_no_controller_spreads_by_own_in_flight(upstreams: StartUpstreams) -> None:
    a, b = await upstreams(2, chunks=100, delay_s=0.01)
    async with serve_gateway(make_fleet([a.url, b.url]), make_tenants()) as g, g.client() as c:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with c.stream("POST", "/v1/chat/completions", json=body) as first:
            assert first.status_code == 200
            busy = next(v.id for v in g.gw.pool.views.values() if v.in_flight == 1)
            r = await c.post("/v1/chat/completions", json={**body, "stream": False, "max_tokens": 2})
            assert r.status_code == 200
            await first.aclose()
        idle_fake = b if busy == "w0" else a
        assert len(idle_fake.bodies) == 1
