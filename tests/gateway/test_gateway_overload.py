"""Overload control without a network: the queue policy (bands, DRR, refusals), the gate's mechanism on a
manual clock (fast path, 429 vs 503, order of shedding, dispatch), the brownout and the TTFT scorer."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from pydantic import ValidationError

from fleet.clock import ManualClock
from fleet.config import TierConfig
from fleet.perf import load_profile
from fleet.plan import PoolPlan
from fleet.store.memory import MemoryStore
from fleet.store.protocol import WorkerState
from gateway.errors import FleetOverloaded, Shed
from gateway.intake.brownout import Brownout, cap_max_tokens
from gateway.intake.fairqueue import Entry, FairQueue
from gateway.intake.overload import Claim, OverloadGate, free_slots
from gateway.routing.context import RouteContext
from gateway.routing.pool import WorkerPool, WorkerView
from gateway.routing.scorers.ttft import TtftScorer, prefill_rates, profile_prefill_rate
from gateway.settings import GatewaySettings
from gateway.upstream.body import parse_completion
from gateway.usage.metrics import GatewayMetrics

from .harness import MODEL, body_rules, make_fleet

INTERACTIVE = TierConfig(priority=0, ttft_target_s=5.0)
STANDARD = TierConfig(priority=5)
BATCH = TierConfig(priority=10, ttft_target_s=1.0, sheddable=True)


def entry(tenant: str, *, priority: int = 0, sheddable: bool = False, cost: int = 100, at: float = 0.0) -> Entry[str]:
    return Entry(tenant, priority, sheddable, cost, at, at + 10.0, item=tenant)


# ------------------------------------------------------------------------------------------ queue policy
def test_drr_gives_two_tenants_of_one_band_equal_token_shares_within_ten_percent() -> None:
    queue: FairQueue[str] = FairQueue(capacity=1000, quantum_tokens=1000)
    for _ in range(300):  # small requests from one tenant, requests three times larger from the other
        queue.offer(entry("small", cost=300))
        queue.offer(entry("large", cost=900))
    tokens: Counter[str] = Counter()
    for _ in range(200):
        popped = queue.pop()
        assert popped is not None
        tokens[popped.tenant] += popped.cost
    share = tokens["small"] / (tokens["small"] + tokens["large"])
    assert 0.45 <= share <= 0.55, tokens


def test_bands_are_served_in_strict_priority_and_fifo_per_tenant() -> None:
    queue: FairQueue[str] = FairQueue(capacity=10, quantum_tokens=1000)
    late_batch, first, second = entry("b", priority=10), entry("a", priority=0, at=1.0), entry("a", priority=0, at=2.0)
    for e in (late_batch, first, second):
        queue.offer(e)
    assert [queue.pop(), queue.pop(), queue.pop(), queue.pop()] == [first, second, late_batch, None]


def test_a_full_queue_sheds_the_youngest_sheddable_of_the_least_important_band_first() -> None:
    queue: FairQueue[str] = FairQueue(capacity=3, quantum_tokens=1000)
    old_batch, young_batch, vip = (
        entry("b1", priority=10, sheddable=True),
        entry("b2", priority=10, sheddable=True),
        entry("i"),
    )
    for e in (old_batch, young_batch, vip):
        assert queue.offer(e) == (True, None)
    assert queue.offer(entry("b3", priority=10, sheddable=True)) == (False, None)  # a peer is not evicted
    newcomer = entry("i2")
    assert queue.offer(newcomer) == (True, young_batch)
    assert queue.offer(entry("i3")) == (True, old_batch)
    assert len(queue) == 3
    assert queue.offer(entry("i4")) == (False, None)  # nothing sheddable left: the arrival is refused
    assert len(queue) == 3
    assert queue.depth(10) == 0
    assert queue.depth(0) == 3


def test_expired_entries_leave_the_queue() -> None:
    queue: FairQueue[str] = FairQueue(capacity=10, quantum_tokens=1000)
    soon, later = Entry("a", 0, False, 1, 0.0, 1.0, "soon"), Entry("a", 0, False, 1, 0.0, 5.0, "later")
    queue.offer(soon)
    queue.offer(later)
    assert queue.expired(1.0) == [soon]
    assert len(queue) == 1
    assert queue.pop() is later


def test_the_queue_rejects_a_bad_size() -> None:
    with pytest.raises(ValueError, match="positive"):
        FairQueue(capacity=0, quantum_tokens=1)


# ---------------------------------------------------------------------------------------- the mechanism
def build_gate(**settings: Any) -> tuple[OverloadGate, WorkerView, ManualClock, GatewayMetrics]:
    clock = ManualClock()
    metrics = GatewayMetrics()
    s = GatewaySettings(**settings)
    fleet = make_fleet(["http://127.0.0.1:9"])
    pool = WorkerPool(fleet=fleet, store=MemoryStore(clock=clock), clock=clock, settings=s, metrics=metrics)
    return OverloadGate(pool, settings=s, metrics=metrics, clock=clock), pool.views["w0"], clock, metrics


def shed(metrics: GatewayMetrics, tier: str, reason: str) -> float:
    value = metrics.registry.get_sample_value("gearshift_gateway_shed_requests_total", {"tier": tier, "reason": reason})
    return value or 0.0


async def enter(
    gate: OverloadGate, worker: WorkerView, tier: TierConfig, tenant: str = "t", tokens: int = 100
) -> float | None:
    name = {0: "interactive", 5: "standard", 10: "batch"}[tier.priority]
    return await gate.enter(Claim(MODEL, tenant, name, tier, tokens), [worker])


def test_headroom_counts_load_prefill_and_kv() -> None:
    _, w, _, _ = build_gate()

    def slots() -> int:
        return free_slots(w, max_occupancy=1.0, kv_threshold=0.9, prefill_tokens_per_slot=1000)

    assert slots() == 64
    w.in_flight, w.prefill_tokens = 60, 2500
    assert slots() == 2  # 64 − 60 − 2.5 = 1.5 → two more fit
    w.state = WorkerState(worker_id="w0", model=MODEL, k_desired=1, k_applied=1, accepted_length=1.0, kv_usage=0.9)
    assert slots() == 0


async def test_with_headroom_a_request_takes_the_fast_path() -> None:
    gate, w, _, _metrics = build_gate()
    assert await enter(gate, w, BATCH) is None
    assert gate.depth(MODEL) == 0


async def test_disabled_overload_control_never_queues() -> None:
    gate, w, _, _ = build_gate(overload_control=False)
    w.in_flight = 1000
    assert await enter(gate, w, BATCH) is None


async def test_sheddable_requests_are_refused_with_429_at_their_target_and_others_wait_then_503() -> None:
    gate, w, clock, metrics = build_gate()
    w.in_flight = w.config.max_num_seqs  # no headroom
    batch = asyncio.create_task(enter(gate, w, BATCH))
    vip = asyncio.create_task(enter(gate, w, INTERACTIVE))
    standard = asyncio.create_task(enter(gate, w, STANDARD))
    await asyncio.sleep(0)
    assert gate.depth(MODEL) == 3
    clock.advance(1.0)
    await gate.tick()
    with pytest.raises(Shed) as refused:
        await batch
    headers = refused.value.headers()
    assert refused.value.status == 429
    assert headers["x-gearshift-limit"] == "overload"
    assert int(headers["retry-after"]) >= 1
    assert not vip.done()
    assert not standard.done()
    clock.advance(4.0)
    await gate.tick()
    with pytest.raises(FleetOverloaded) as timed_out:
        await vip
    assert timed_out.value.status == 503
    assert "retry-after" in timed_out.value.headers()
    assert not standard.done()  # no TTFT target: it waits up to overload_max_wait_s
    clock.advance(25.0)
    await gate.tick()
    with pytest.raises(FleetOverloaded):
        await standard
    assert shed(metrics, "batch", "ttft_target") == 1
    assert shed(metrics, "interactive", "wait_timeout") == 1
    assert shed(metrics, "standard", "wait_timeout") == 1
    assert gate.depth(MODEL) == 0


async def test_capacity_dispatches_the_most_important_band_first() -> None:
    gate, w, _clock, _ = build_gate()
    w.in_flight = w.config.max_num_seqs
    order: list[str] = []

    async def run(tier: TierConfig, name: str) -> None:
        await enter(gate, w, tier)
        order.append(name)
        w.in_flight += 1  # it takes its worker at once, like the pipeline's hold

    tasks = [asyncio.create_task(run(BATCH, "batch")), asyncio.create_task(run(INTERACTIVE, "interactive"))]
    await asyncio.sleep(0)
    w.in_flight -= 1  # one slot comes back
    gate.poke(MODEL)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert order == ["interactive"]
    w.in_flight -= 1
    await gate.tick()
    await asyncio.gather(*tasks)
    assert order == ["interactive", "batch"]


async def test_a_full_queue_refuses_a_sheddable_arrival_with_429_and_a_vip_with_503() -> None:
    gate, w, _, metrics = build_gate(overload_queue_size=2)
    w.in_flight = w.config.max_num_seqs
    waiting = [asyncio.create_task(enter(gate, w, INTERACTIVE)) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(Shed):
        await enter(gate, w, BATCH)
    with pytest.raises(FleetOverloaded):
        await enter(gate, w, INTERACTIVE)
    assert shed(metrics, "batch", "queue_full") == 1
    assert shed(metrics, "interactive", "queue_full") == 1
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert gate.depth(MODEL) == 0


async def test_a_vip_arrival_evicts_a_queued_sheddable_request() -> None:
    gate, w, _, metrics = build_gate(overload_queue_size=1)
    w.in_flight = w.config.max_num_seqs
    batch = asyncio.create_task(enter(gate, w, BATCH))
    await asyncio.sleep(0)
    vip = asyncio.create_task(enter(gate, w, INTERACTIVE))
    with pytest.raises(Shed):
        await batch
    assert shed(metrics, "batch", "evicted") == 1
    vip.cancel()
    await asyncio.gather(vip, return_exceptions=True)


async def test_a_sheddable_request_predicted_to_miss_its_target_is_refused_at_once() -> None:
    gate, w, clock, metrics = build_gate()
    w.in_flight = w.config.max_num_seqs
    backlog = [asyncio.create_task(enter(gate, w, BATCH, tenant=f"t{i}")) for i in range(10)]
    await asyncio.sleep(0)
    for _ in range(2):  # two dispatches 0.5 s apart: the queue drains at about two per second
        w.in_flight -= 1
        gate.poke(MODEL)
        await asyncio.sleep(0)  # the dispatched waiter runs and takes its slot
        w.in_flight += 1
        clock.advance(0.5)
    with pytest.raises(Shed):
        await enter(gate, w, BATCH)  # nine ahead of it (itself included) at 2/s: 4.5 s > the 1 s target
    assert shed(metrics, "batch", "predicted_ttft") == 1
    for task in backlog:
        task.cancel()
    results = await asyncio.gather(*backlog, return_exceptions=True)
    assert sum(isinstance(r, float) for r in results) == 2  # the two dispatched; the rest cancelled


async def test_a_cancelled_waiter_leaves_the_queue_and_holds_nothing() -> None:
    gate, w, _, _ = build_gate()
    w.in_flight = w.config.max_num_seqs
    task = asyncio.create_task(enter(gate, w, INTERACTIVE))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert gate.depth(MODEL) == 0
    w.in_flight = 0
    assert await enter(gate, w, INTERACTIVE) is None  # nothing pending: the fast path is open again


async def test_a_waiter_dispatched_then_cancelled_returns_its_dispatch() -> None:
    gate, w, _, _ = build_gate()
    w.in_flight = w.config.max_num_seqs
    task = asyncio.create_task(enter(gate, w, INTERACTIVE))
    await asyncio.sleep(0)
    w.in_flight = w.config.max_num_seqs - 1
    gate.poke(MODEL)  # dispatched: it counts as pending until it runs
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert await enter(gate, w, INTERACTIVE) is None  # the one free slot is free again


async def test_a_queued_request_waits_for_its_own_candidates_not_any_worker_of_the_model() -> None:
    """Hardening defect 3: a batch request whose pool is at its plan cap is not released because an interactive
    worker of the same model has room (it would then be routed to the full batch worker, holding the
    interactive pool's headroom meanwhile); an interactive arrival still goes at once."""
    clock, metrics, s = ManualClock(), GatewayMetrics(), GatewaySettings()
    fleet = make_fleet(["http://127.0.0.1:9", "http://127.0.0.1:10"])
    pool = WorkerPool(fleet=fleet, store=MemoryStore(clock=clock), clock=clock, settings=s, metrics=metrics)
    gate = OverloadGate(pool, settings=s, metrics=metrics, clock=clock)
    interactive, batch = pool.views["w0"], pool.views["w1"]
    batch.pool = PoolPlan(name="bulk", classes=["batch/*"], workers=["w1"], max_concurrency=1)
    batch.in_flight = 1  # the batch pool is at its cap; the interactive worker is idle
    queued = asyncio.create_task(enter(gate, batch, BATCH))
    await asyncio.sleep(0)
    assert gate.depth(MODEL) == 1
    gate.poke(MODEL)
    await gate.tick()
    await asyncio.sleep(0)
    assert not queued.done(), "released against the interactive worker's headroom"
    assert await asyncio.wait_for(enter(gate, interactive, INTERACTIVE), 1.0) is not None  # its own room: at once
    assert not queued.done()
    batch.in_flight = 0  # the batch worker's call ended
    gate.poke(MODEL)
    assert await asyncio.wait_for(queued, 1.0) is not None
    assert gate.depth(MODEL) == 0


# ----------------------------------------------------------------------------------------------- brownout
def test_automatic_brownout_needs_sustained_overload_and_recovers() -> None:
    b = Brownout(mode="auto", after_s=10.0, recover_s=30.0)
    b.observe(overloaded=True, now=0.0)
    b.observe(overloaded=False, now=5.0)  # a break restarts the count
    b.observe(overloaded=True, now=6.0)
    b.observe(overloaded=True, now=15.0)
    assert not b.active
    b.observe(overloaded=True, now=16.0)
    assert b.active
    b.observe(overloaded=False, now=20.0)
    assert b.active
    b.observe(overloaded=False, now=50.0)
    assert not b.active
    b.mode = "on"
    assert b.active
    b.observe(overloaded=True, now=100.0)
    b.observe(overloaded=True, now=200.0)
    b.mode = "off"
    assert not b.active
    assert b.auto_on


def test_brownout_caps_max_tokens_and_the_reservation() -> None:
    tier = TierConfig(brownout_max_tokens=64)
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000, "n": 2}'
    req = parse_completion(raw, prompt_field="messages", rules=body_rules())
    reserved = req.reserved_tokens
    assert cap_max_tokens(req, tier, default_max_tokens=4096)
    assert req.body["max_tokens"] == req.max_tokens == 64
    assert req.reserved_tokens == reserved - (1000 - 64) * 2
    assert not cap_max_tokens(req, tier, default_max_tokens=4096)  # already within the cap
    assert not cap_max_tokens(req, TierConfig(), default_max_tokens=4096)


def test_brownout_cap_must_be_positive() -> None:
    with pytest.raises(ValidationError, match="brownout_max_tokens"):
        TierConfig(brownout_max_tokens=0)


async def test_auto_brownout_follows_the_gate_queue() -> None:
    gate, w, clock, metrics = build_gate(brownout_after_s=2.0, overload_max_wait_s=100.0)
    w.in_flight = w.config.max_num_seqs
    task = asyncio.create_task(enter(gate, w, STANDARD))
    await asyncio.sleep(0)
    for _ in range(3):
        await gate.tick()
        clock.advance(1.0)
    await gate.tick()
    assert gate.brownout.active
    assert metrics.registry.get_sample_value("gearshift_gateway_brownout") == 1.0
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


# ------------------------------------------------------------------------------------------- TTFT scorer
async def test_ttft_scorer_weighs_queued_prefill_against_the_prefill_rate() -> None:
    a, b = (WorkerView(config=c) for c in make_fleet(["http://127.0.0.1:1", "http://127.0.0.1:2"]).workers)
    a.prefill_tokens = 20_000
    scorer = TtftScorer(rates={a.id: 10_000.0, b.id: 1_000.0}, reference_s=2.0)
    ctx = RouteContext(model=MODEL, tier=TierConfig(ttft_target_s=1.0), now=0.0, prompt_tokens=1000)
    # a: (20 000 + 1 000) / 10 000 = 2.1 s; b: 1 000 / 1 000 = 1 s (a slower prefiller with nothing queued)
    assert await scorer(ctx, [a, b]) == pytest.approx([1 / (1 + 2.1), 1 / (1 + 1.0)])
    assert scorer.predicted_ttft(ctx, a) == pytest.approx(2.1)


def test_prefill_rates_come_from_the_profile_unless_overridden() -> None:
    fleet = make_fleet(["http://127.0.0.1:1"])
    rates = prefill_rates(fleet)
    assert 1_000 < rates["w0"] < 100_000  # Kimi K3 on 16 B300: about 14 000 prompt tokens per second
    assert prefill_rates(fleet, override=500.0) == {"w0": 500.0}
    with pytest.raises(ValueError, match="positive"):
        TtftScorer(rates={"w0": 0.0}, reference_s=2.0)
    assert rates["w0"] == pytest.approx(profile_prefill_rate(load_profile("kimi-k3-dspark-tp16")))
