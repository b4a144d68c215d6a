"""The fleet plan contract (``fleet.plan``): classes, pools, freshness, validation and the store round trip."""

from __future__ import annotations

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
