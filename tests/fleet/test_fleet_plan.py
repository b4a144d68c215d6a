"""The fleet plan contract (``fleet.plan``): classes, pools, freshness, validation and the store round trip."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from fleet.clock import ManualClock
from fleet.plan import (
    PLANS_COLLECTION,
    STORE_TTL_FACTOR,
    FleetPlan,
    PoolPlan,
    class_tier,
    publish_plan,
    read_plans,
    traffic_class,
)
from fleet.store.memory import MemoryStore

T0 = 1_700_000_000.0


def plan(**overrides: Any) -> FleetPlan:
    fields: dict[str, Any] = {
        "model": "kimi-k3",
        "version": 3,
        "issued_at": T0,
        "ttl_s": 30.0,
        "pools": [
            {"name": "fast", "classes": ["interactive/chat", "interactive/code"], "workers": ["w0", "w1"], "k": 4},
            {"name": "bulk", "classes": ["batch/*"], "workers": ["w2"], "k": 1, "max_concurrency": 48},
        ],
        "reason": "split",
    }
    return FleetPlan.model_validate({**fields, **overrides})


def test_traffic_class_names_tier_and_workload() -> None:
    assert traffic_class("interactive", "chat") == "interactive/chat"
    assert traffic_class("batch", None) == "batch/default"
    assert class_tier("batch/maths") == "batch"


def test_pools_of_workers_and_classes_with_a_tier_wildcard() -> None:
    p = plan()
    assert [pool.name for pool in p.pools_for("interactive/chat")] == ["fast"]
    assert [pool.name for pool in p.pools_for("batch/maths")] == ["bulk"], "batch/* covers every batch workload"
    assert p.pools_for("interactive/maths") == []
    pool = p.pool_of_worker("w2")
    assert pool is not None
    assert (pool.name, pool.k, pool.max_concurrency) == ("bulk", 1, 48)
    assert p.pool_of_worker("w9") is None


def test_a_plan_is_fresh_for_its_ttl() -> None:
    p = plan()
    assert p.fresh(T0 + p.ttl_s)
    assert not p.fresh(T0 + p.ttl_s + 0.01)
    assert p.age_s(T0 + 5) == 5


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"pools": [{"name": "a", "classes": ["chat"], "workers": []}]}, "pools.0: classes[0]"),
        ({"pools": [{"name": "a", "classes": [], "workers": ["w0", "w0"]}]}, "pools.0: workers: duplicate"),
        ({"pools": [{"name": "a", "classes": [], "workers": ["w0"]}, {"name": "b", "classes": [], "workers": ["w0"]}]},
         ": pools[1].workers: worker 'w0' is already in pool 'a'"),
        ({"pools": [{"name": "a", "classes": [], "workers": []}, {"name": "a", "classes": [], "workers": []}]},
         ": pools: duplicate pool name"),
        ({"pools": [{"name": "a", "classes": [], "workers": [], "k": -1}]}, "pools.0.k: "),
        ({"pools": [{"name": "a", "classes": [], "workers": [], "max_concurrency": 0}]}, "pools.0.max_concurrency: "),
        ({"ttl_s": 0}, "ttl_s: "),
        ({"spill_margin": 1.0}, "spill_margin: "),
    ],
)  # fmt: skip
def test_validation_names_the_bad_field(overrides: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError) as err:
        plan(**overrides)
    rendered = [
        ".".join(map(str, e["loc"])) + ": " + e["msg"].removeprefix("Value error, ") for e in err.value.errors()
    ]
    assert any(named in line for line in rendered), rendered


async def test_publish_and_read_back_then_expire_from_the_store() -> None:
    clock = ManualClock(T0)
    store = MemoryStore(clock=clock)
    p = plan()
    await publish_plan(store, p)
    await store.put_doc(PLANS_COLLECTION, "broken", '{"model": "broken"}')
    assert await read_plans(store) == {"kimi-k3": p}, "an invalid document is skipped"
    clock.advance(p.ttl_s * STORE_TTL_FACTOR - 1)
    assert "kimi-k3" in await read_plans(store), "a stale plan stays readable (explain shows it)"
    clock.advance(2)
    assert "kimi-k3" not in await read_plans(store)


def test_pool_serves_exact_and_wildcard_classes() -> None:
    pool = PoolPlan(name="p", classes=["batch/*", "interactive/chat"], workers=[])
    assert pool.serves("batch/anything")
    assert pool.serves("interactive/chat")
    assert not pool.serves("interactive/code")


OLD_POOL_FIELDS = {"name", "classes", "workers", "k", "max_concurrency"}
OLD_PLAN_FIELDS = {"model", "version", "issued_at", "ttl_s", "pools", "spill_margin", "reason", "predicted"}


async def test_a_plan_without_the_new_fields_is_stored_as_an_older_gateway_reads_it() -> None:
    store = MemoryStore(clock=ManualClock(T0))
    await publish_plan(store, plan())
    body = json.loads((await store.docs(PLANS_COLLECTION))["kimi-k3"])
    assert set(body) <= OLD_PLAN_FIELDS
    assert all(set(pool) <= OLD_POOL_FIELDS for pool in body["pools"])


async def test_the_issue_25_pool_fields_round_trip() -> None:
    store = MemoryStore(clock=ManualClock(T0))
    pools = [
        {"name": "fast", "classes": ["interactive/*"], "workers": ["w0", "w1"], "k_cap": 4,
         "worker_caps": {"w1": 16}, "forecast": {"interactive/chat": {"rate_rps": 2.0, "upper_rps": 2.6}}},
        {"name": "off", "classes": ["batch/*"], "workers": ["w2"], "k": 0, "drafter": "off"},
    ]  # fmt: skip
    p = plan(pools=pools)
    await publish_plan(store, p)
    back = (await read_plans(store))["kimi-k3"]
    assert back == p
    fast, off = back.pools
    assert (fast.concurrency_cap("w0"), fast.concurrency_cap("w1")) == (None, 16)
    assert off.drafter == "off"
    assert fast.forecast["interactive/chat"].upper_rps == 2.6


@pytest.mark.parametrize(
    ("pool", "field"),
    [
        ({"k": 2, "drafter": "off"}, "k"),
        ({"k": 2, "k_cap": 4}, "k_cap"),
        ({"worker_caps": {"w9": 4}}, "worker_caps"),
    ],
)
def test_pool_fields_that_contradict_each_other_are_refused(pool: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        PoolPlan.model_validate({"name": "p", "classes": ["batch/*"], "workers": ["w0"], **pool})
