"""Placement routing (``gateway.routing.placement``): pools, one-way spill-over bounded by SLA headroom, caps, stale
plans, and the workload hint through a real gateway."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.config import TierConfig
from fleet.perf import load_profile
from fleet.plan import SPILL_LIMIT_KEY, FleetPlan, publish_plan, traffic_class
from fleet.store.memory import MemoryStore
from fleet.store.protocol import WorkerState
from gateway.errors import InvalidRequest
from gateway.intake.overload import free_slots
from gateway.routing.context import RouteContext
from gateway.routing.filters.placement import PlacementFilter, placement_filter, predicted_tpot_s, request_workload
from gateway.routing.pool import WorkerView
from gateway.usage.metrics import GatewayMetrics

from .harness import MODEL, StartUpstreams, eventually, make_fleet, make_tenants, serve_gateway

NOW = 1_700_000_000.0
TENANTS = make_tenants()
INTERACTIVE, BATCH = TENANTS.tiers["interactive"], TENANTS.tiers["batch"]
PROFILE = load_profile("kimi-k3-dspark-tp16")


def fleet_views(n: int) -> list[WorkerView]:
    return [WorkerView(config=w) for w in make_fleet([f"http://127.0.0.1:{9000 + i}" for i in range(n)]).workers]


def make_plan(*, issued_at: float = NOW, cap: int | None = None, **overrides: Any) -> FleetPlan:
    """w0, w1 serve interactive chat (k=4); w2 serves every batch workload (k=1, ``cap``); w3 is left out."""
    fields: dict[str, Any] = {
        "model": MODEL, "version": 1, "issued_at": issued_at, "ttl_s": 10.0, "spill_margin": 0.2,
        "pools": [
            {"name": "fast", "classes": ["interactive/chat"], "workers": ["w0", "w1"], "k": 4, "max_concurrency": cap},
            {"name": "bulk", "classes": ["batch/*"], "workers": ["w2"], "k": 1, "max_concurrency": cap},
        ],
    }  # fmt: skip
    return FleetPlan.model_validate({**fields, **overrides})


def route_ctx(tier: TierConfig, workload: str | None, plan: FleetPlan | None, *, now: float = NOW) -> RouteContext:
    tier_name = "interactive" if tier is INTERACTIVE else "batch"
    return RouteContext(model=MODEL, tier=tier, now=now, traffic_class=traffic_class(tier_name, workload), plan=plan)


def placement(metrics: GatewayMetrics | None = None) -> PlacementFilter:
    return placement_filter(make_fleet([f"http://127.0.0.1:{9000 + i}" for i in range(4)]), TENANTS, metrics=metrics)


def ids(workers: list[WorkerView]) -> list[str]:
    return [w.id for w in workers]


def state(worker: WorkerView, *, running: float, k: int = 4, kv: float = 0.2) -> WorkerState:
    return WorkerState(
        worker_id=worker.id, model=MODEL, k_desired=k, k_applied=k, accepted_length=3.0, running=running, kv_usage=kv
    )


async def test_each_class_goes_to_its_pool_and_unplanned_workers_serve_all() -> None:
    views, f = fleet_views(4), placement()
    plan = make_plan()
    assert ids(await f(route_ctx(INTERACTIVE, "chat", plan), views)) == ["w0", "w1", "w3"]
    assert ids(await f(route_ctx(BATCH, "maths", plan), views)) == ["w2", "w3"]
    assert ids(await f(route_ctx(BATCH, None, plan), views)) == ["w2", "w3"], "batch/* covers batch/default"


@pytest.mark.parametrize(
    "plan",
    [None, make_plan(issued_at=NOW - 10.5), make_plan(model="other-model")],
    ids=["no-plan", "stale", "other-model"],
)
async def test_without_a_fresh_plan_for_the_model_every_worker_stays(plan: FleetPlan | None) -> None:
    views = fleet_views(4)
    assert ids(await placement()(route_ctx(BATCH, "maths", plan), views)) == ids(views)


async def test_a_class_no_pool_serves_is_routed_on_load_alone() -> None:
    views = fleet_views(4)
    assert ids(await placement()(route_ctx(INTERACTIVE, "maths", make_plan()), views)) == ids(views)


async def test_interactive_work_spills_onto_the_batch_pool_when_its_own_is_full() -> None:
    views, f = fleet_views(3), placement()
    for v in views[:2]:
        v.in_flight = 8
    assert ids(await f(route_ctx(INTERACTIVE, "chat", make_plan(cap=8)), views)) == ["w2"]


async def test_batch_spills_onto_an_interactive_worker_only_within_its_tpot_headroom() -> None:
    views = fleet_views(3)
    light, heavy, bulk = views
    light.state, heavy.state = state(light, running=2), state(heavy, running=40)
    bulk.in_flight = 8  # the batch pool is at its cap
    tpot_light, tpot_heavy = predicted_tpot_s(light, PROFILE), predicted_tpot_s(heavy, PROFILE)
    assert tpot_light is not None
    assert tpot_heavy is not None
    assert tpot_light < tpot_heavy, "one more sequence on a large batch costs more"
    # An interactive target that the light worker meets with the margin to spare and the heavy one does not.
    target = (tpot_light + tpot_heavy) / 2 / (1 - 0.2)
    tenants = make_tenants()
    tiers = {**tenants.tiers, "interactive": INTERACTIVE.model_copy(update={"tpot_target_s": target})}
    f = PlacementFilter(tiers=tiers, profiles={v.id: PROFILE for v in views})
    plan = make_plan(cap=8)
    assert ids(await f(route_ctx(BATCH, "maths", plan), views)) == ["w0"]
    light.state = state(light, running=40)
    assert ids(await f(route_ctx(BATCH, "maths", plan), views)) == ["w2"], "no headroom: it waits for its own pool"
    light.state = None
    assert ids(await f(route_ctx(BATCH, "maths", plan), views)) == ["w2"], "no published state: no prediction"


async def test_a_saturated_pool_keeps_its_own_workers_and_their_free_slots_count_the_cap() -> None:
    views, metrics = fleet_views(3), GatewayMetrics()
    f = placement(metrics)
    for v in views:
        v.in_flight = 8
    plan = make_plan(cap=8)
    assert ids(await f(route_ctx(BATCH, "maths", plan), views)) == ["w2"]
    views[2].pool = plan.pool_of_worker("w2")
    views[2].in_flight = 5
    assert free_slots(views[2], max_occupancy=1.0, kv_threshold=1.0, prefill_tokens_per_slot=1024) == 3
    views[2].pool = None
    assert free_slots(views[2], max_occupancy=1.0, kv_threshold=1.0, prefill_tokens_per_slot=1024) == 64 - 5
    sample = metrics.registry.get_sample_value
    assert sample("gearshift_gateway_placement_routes_total", {"model": MODEL, "outcome": "saturated"}) == 1


def test_a_pools_target_is_the_tightest_of_its_tiers() -> None:
    plan = make_plan()
    assert plan.pools[0].tpot_target(TENANTS.tiers) == INTERACTIVE.tpot_target_s
    assert plan.pools[1].tpot_target(TENANTS.tiers) is None


def test_the_workload_comes_from_the_header_else_the_tenant() -> None:
    tenants = make_tenants(beta={"workload": "maths"})
    alpha, beta = tenants.tenant("alpha"), tenants.tenant("beta")
    assert alpha is not None
    assert beta is not None
    assert request_workload(None, alpha) is None
    assert request_workload(None, beta) == "maths"
    assert request_workload("code", beta) == "code"
    with pytest.raises(InvalidRequest, match="x-gearshift-workload"):
        request_workload("no spaces/allowed", beta)


async def test_the_gateway_follows_a_published_plan_and_meters_the_workload(upstreams: StartUpstreams) -> None:
    workers = await upstreams(3)
    store = MemoryStore()
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    tenants = make_tenants(beta={"workload": "maths"})
    async with serve_gateway(make_fleet([w.url for w in workers]), tenants, store=store) as g:
        plan = make_plan(issued_at=g.gw.clock.wall(), cap=None)
        await publish_plan(store, plan)

        async def read() -> bool:
            return g.gw.pool.views["w2"].pool is not None

        await eventually(read)
        async with g.client("alpha") as alpha, g.client("beta") as beta:
            for _ in range(4):
                hinted = await alpha.post("/v1/chat/completions", json=chat, headers={"x-gearshift-workload": "chat"})
                assert hinted.status_code == 200
                assert (await beta.post("/v1/chat/completions", json=chat)).status_code == 200
            bad = await alpha.post("/v1/chat/completions", json=chat, headers={"x-gearshift-workload": "a b"})
            assert bad.status_code == 400
        await g.gw.ledger.idle()
        records = await store.ledger(since=0, until=g.gw.clock.wall() + 1)
    served = {(r.tenant, r.workload, r.worker_id) for r in records}
    assert {(t, wl) for t, wl, _ in served} == {("alpha", "chat"), ("beta", "maths")}
    assert {w for t, _, w in served if t == "alpha"} <= {"w0", "w1"}
    assert {w for t, _, w in served if t == "beta"} == {"w2"}
    assert all("x-gearshift-workload" not in body for w in workers for body in w.bodies)


async def test_batch_spill_onto_an_interactive_pool_stops_at_the_plans_spill_limit() -> None:
    """``spill_limit/<pool>`` (the planner's in-flight bound per worker under which the pool's predicted TPOT keeps
    its margin, for the forecast mix) bounds spill-over too (issue 23: the planner computed it and no one read it)."""
    views = fleet_views(3)
    light, _, bulk = views
    light.state = state(light, running=2)
    bulk.in_flight = 8  # the batch pool is at its cap
    f = PlacementFilter(tiers=TENANTS.tiers, profiles={v.id: PROFILE for v in views})
    target = INTERACTIVE.tpot_target_s
    assert target is not None
    tpot = predicted_tpot_s(light, PROFILE)
    assert tpot is not None
    assert tpot <= (1 - 0.2) * target, "the live prediction alone would let batch work spill onto w0"
    for limit, routed in ((3.0, ["w0"]), (2.0, ["w2"]), (0.0, ["w2"])):
        plan = make_plan(cap=8, predicted={f"{SPILL_LIMIT_KEY}fast": limit})
        assert ids(await f(route_ctx(BATCH, "maths", plan), views)) == routed, f"spill limit {limit}, load 2"
    assert ids(await f(route_ctx(BATCH, "maths", make_plan(cap=8)), views)) == ["w0"], "no limit published"


def test_the_gateway_reads_the_spill_limit_under_the_name_the_planner_writes() -> None:
    from controller.planner import SPILL_LIMIT_KEY as WRITTEN

    assert WRITTEN == SPILL_LIMIT_KEY
    assert make_plan(predicted={f"{WRITTEN}fast": 5.0}).spill_limit("fast") == 5
    assert make_plan().spill_limit("fast") is None
