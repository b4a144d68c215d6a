"""Speculation per tier and per request (issue 25): the tier field and its legacy form, the tenant's header
policy, the speculation filter, and the request path (400 naming the header, the mode in the ledger and the
metrics)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from fleet.config import (
    ConfigError,
    SpeculationMode,
    SpeculationPreference,
    TenantConfig,
    TenantsConfig,
    TierConfig,
    parse_model,
)
from fleet.plan import FleetPlan, PoolPlan
from fleet.store.memory import MemoryStore
from fleet.store.protocol import WorkerState
from fleet.worker_mode import Mode, WorkerMode, write_mode
from gateway.errors import HeaderNotAllowed
from gateway.routing.context import RouteContext
from gateway.routing.filters.speculation import SpeculationFilter, request_speculation
from gateway.routing.pool import WorkerView

from .harness import MODEL, StartUpstreams, eventually, make_fleet, make_tenants, serve_gateway

HEADER = "x-gearshift-speculation"
FILTER = SpeculationFilter()
TIER = TierConfig(tpot_target_s=0.05)


def tenant(*allowed: SpeculationMode) -> TenantConfig:
    return TenantConfig(id="t", tier="interactive", speculation_header=allowed)


def view(i: int, *, k: int | None = None, tpot_s: float | None = None, mode: Mode | None = None) -> WorkerView:
    config = make_fleet([f"http://127.0.0.1:{9000 + j}" for j in range(i + 1)]).workers[i]
    state = None
    if k is not None:
        state = WorkerState(worker_id=config.id, model=MODEL, k_desired=k, k_applied=k, accepted_length=1.0 + k / 2,
                            tpot_predicted_s=tpot_s)  # fmt: skip
    record = WorkerMode(worker_id=config.id, mode=mode, since=0.0, mode_since=0.0) if mode is not None else None
    return WorkerView(config=config, state=state, mode=record)


def ctx(mode: SpeculationMode, tier: TierConfig = TIER) -> RouteContext:
    return RouteContext(model=MODEL, tier=tier, now=1000.0, speculation=mode)


# ------------------------------------------------------------------------------------------------- config
def test_the_tier_field_is_the_mode_and_the_old_values_are_the_scorers_preference() -> None:
    assert TierConfig().speculation is SpeculationMode.AUTO
    assert TierConfig.model_validate({"speculation": "off"}).speculation is SpeculationMode.OFF
    legacy = TierConfig.model_validate({"speculation": "throughput", "tpot_target_s": 0.1})
    assert (legacy.speculation, legacy.prefer) == (SpeculationMode.AUTO, SpeculationPreference.THROUGHPUT)
    both = TierConfig.model_validate({"speculation": "fast", "prefer": "speed"})
    assert (both.speculation, both.prefer) == (SpeculationMode.FAST, SpeculationPreference.SPEED)
    assert TierConfig.model_validate(legacy.model_dump()) == legacy, "a dumped tier reads back the same"
    bare = yaml.safe_load("tier: {speculation: off}\nheader: [off, fast]")  # YAML 1.1: a bare off is false
    assert TierConfig.model_validate(bare["tier"]).speculation is SpeculationMode.OFF
    assert tenant(*bare["header"]).speculation_header == (SpeculationMode.OFF, SpeculationMode.FAST)
    with pytest.raises(ConfigError, match=r"tier: speculation: .*'auto', 'off' or 'fast'"):
        parse_model(TierConfig, {"speculation": "fastest"}, source="tier")


def test_a_tenants_header_policy_names_modes() -> None:
    tenants = make_tenants(alpha={"speculation_header": ["off", "fast"]})
    alpha = tenants.tenant("alpha")
    assert alpha is not None
    assert alpha.speculation_header == (SpeculationMode.OFF, SpeculationMode.FAST)
    with pytest.raises(ValueError, match="speculation_header"):
        TenantsConfig.model_validate({"tiers": {"t": {}}, "tenants": [{"id": "a", "tier": "t",
                                                                        "speculation_header": ["slow"]}]})  # fmt: skip


# ------------------------------------------------------------------------------------------------- header
def test_without_the_header_the_mode_is_the_tiers() -> None:
    assert request_speculation(None, tenant(), TierConfig(speculation=SpeculationMode.OFF)) is SpeculationMode.OFF
    assert request_speculation(None, tenant(), TIER) is SpeculationMode.AUTO


def test_the_header_overrides_the_tier_only_with_a_value_the_tenant_may_send() -> None:
    assert request_speculation("off", tenant(SpeculationMode.OFF), TIER) is SpeculationMode.OFF
    assert request_speculation(" FAST ", tenant(SpeculationMode.FAST), TIER) is SpeculationMode.FAST
    with pytest.raises(HeaderNotAllowed, match="may not send the 'x-gearshift-speculation' header") as refused:
        request_speculation("fast", tenant(SpeculationMode.OFF), TIER)
    assert (refused.value.status, refused.value.param) == (400, HEADER)
    with pytest.raises(HeaderNotAllowed, match=r"allows: none"):
        request_speculation("auto", tenant(), TIER)
    with pytest.raises(HeaderNotAllowed, match="must be one of auto, off, fast"):
        request_speculation("sometimes", tenant(SpeculationMode.OFF), TIER)


# ------------------------------------------------------------------------------------------------- filter
async def test_off_keeps_only_the_workers_started_without_a_drafter() -> None:
    drafter, free, unknown, k0 = (view(0, k=4, mode=Mode.DRAFTER), view(1, k=0, mode=Mode.DRAFTER_FREE),
                                  view(2, k=4), view(3, k=0))  # fmt: skip
    workers = [drafter, free, unknown, k0]
    assert await FILTER(ctx(SpeculationMode.OFF), workers) == [free]
    assert await FILTER(ctx(SpeculationMode.OFF), [drafter, unknown, k0]) == [], "off is a promise: no fallback"
    assert await FILTER(ctx(SpeculationMode.AUTO), workers) == workers


async def test_fast_keeps_the_highest_k_that_meets_the_tiers_tpot_target() -> None:
    k6_late, k4, k4_too, k2 = (view(0, k=6, tpot_s=0.08), view(1, k=4, tpot_s=0.03), view(2, k=4, tpot_s=0.045),
                               view(3, k=2, tpot_s=0.02))  # fmt: skip
    free = view(4, k=0, tpot_s=0.01, mode=Mode.DRAFTER_FREE)
    workers = [k6_late, k4, k4_too, k2, free]
    assert await FILTER(ctx(SpeculationMode.FAST), workers) == [k4, k4_too]
    no_target = TierConfig()
    assert await FILTER(ctx(SpeculationMode.FAST, no_target), workers) == [k6_late]


async def test_fast_without_a_qualifying_worker_keeps_every_worker_for_the_scorers() -> None:
    workers = [view(0, k=6, tpot_s=0.08), view(1), view(2, k=0, mode=Mode.DRAFTER_FREE)]
    assert await FILTER(ctx(SpeculationMode.FAST), workers) == workers


# --------------------------------------------------------------------------------------------- request path
async def test_the_gateway_routes_off_to_drafter_free_workers_meters_the_mode_and_refuses_a_forbidden_header(
    upstreams: StartUpstreams,
) -> None:
    workers = await upstreams(3)
    store = MemoryStore()
    await write_mode(store, WorkerMode(worker_id="w1", mode=Mode.DRAFTER_FREE, since=0.0, mode_since=0.0))
    tenants = make_tenants(alpha={"speculation_header": ["off"]})
    off_tier = tenants.tiers["batch"].model_copy(update={"speculation": SpeculationMode.OFF})
    tenants = tenants.model_copy(update={"tiers": {**tenants.tiers, "batch": off_tier}})  # beta: off by its tier
    body: dict[str, Any] = {"model": MODEL, "prompt": "hello", "max_tokens": 3}
    async with serve_gateway(make_fleet([w.url for w in workers]), tenants, store=store) as g:
        await eventually(lambda: g.gw.pool.views["w1"].mode is not None)
        async with g.client("alpha") as alpha, g.client("beta") as beta:
            for _ in range(6):
                off = await alpha.post("/v1/completions", json=body, headers={HEADER: "off"})
                assert off.status_code == 200, off.text
                assert (await alpha.post("/v1/completions", json=body)).status_code == 200
                assert (await beta.post("/v1/completions", json=body)).status_code == 200
            forbidden = await beta.post("/v1/completions", json=body, headers={HEADER: "off"})
            fast = await alpha.post("/v1/completions", json=body, headers={HEADER: "fast"})
        await g.gw.ledger.idle()
        records = await store.ledger(since=0, until=g.gw.clock.wall() + 1)
        sample = g.gw.metrics.registry.get_sample_value
        counted = {m: sample("gearshift_gateway_speculation_requests_total", {"model": MODEL, "speculation": m})
                   for m in ("off", "auto")}  # fmt: skip
    for refused in (forbidden, fast):
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert (error["param"], error["code"], error["type"]) == (HEADER, "header_not_allowed", "invalid_request_error")
        assert HEADER in error["message"]
    assert {r.worker_id for r in records if r.speculation == "off"} == {"w1"}
    assert {(r.tenant, r.speculation) for r in records} == {("alpha", "off"), ("alpha", "auto"), ("beta", "off")}
    assert {r.worker_id for r in records if r.speculation == "auto"} - {"w1"}, "auto: the other workers too"
    assert len(records) == 18, "the refused requests reached no worker"
    assert counted == {"off": 12.0, "auto": 6.0}


async def test_off_also_keeps_skip_workers_the_fresh_plan_pins_at_k0() -> None:
    def skip(i: int, k: int) -> WorkerView:
        v = view(i, k=k, mode=Mode.DRAFTER)
        v.config = v.config.model_copy(update={"drafter": v.config.drafter.model_copy(update={"idle_skip": True})})
        return v

    pinned, stock, moving, free_pool = skip(0, 0), view(1, k=0, mode=Mode.DRAFTER), skip(2, 3), skip(3, 0)
    plan = FleetPlan(
        model=MODEL, version=1, issued_at=1000.0, ttl_s=30.0,
        pools=[PoolPlan(name="k0", classes=["nospec/*"], workers=[pinned.id, stock.id, moving.id], k=0),
               PoolPlan(name="rest", classes=["interactive/*"], workers=[free_pool.id])],
    )  # fmt: skip
    workers = [pinned, stock, moving, free_pool]
    off = RouteContext(model=MODEL, tier=TIER, now=1000.0, speculation=SpeculationMode.OFF, plan=plan)
    # Only the skip worker pinned at k = 0 that has applied it: the stock one pays its drafter, the moving one has
    # not reached k = 0 yet, and the last one's pool lets its loop choose k.
    assert await FILTER(off, workers) == [pinned]
    stale = RouteContext(model=MODEL, tier=TIER, now=1000.0 + 31.0, speculation=SpeculationMode.OFF, plan=plan)
    assert await FILTER(stale, workers) == [], "a stale plan pins nothing"
