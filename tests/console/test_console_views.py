"""The console's figures from admin API data (pure): TPOT quantiles, pools and modes per worker, tier
attainment, costs per tenant and model with the drafter's share and the k = 0 counterfactual, forms."""

from __future__ import annotations

from typing import Any

from fleet.config import TierConfig
from fleet.plan import FleetPlan, PoolPlan
from fleet.store.protocol import UsageRecord, WorkerState
from gateway.http.console import forms, views


def record(i: int, **fields: Any) -> UsageRecord:
    base: dict[str, Any] = {
        "request_id": f"r{i}",
        "tenant": "acme",
        "model": "m",
        "worker_id": "w0",
        "prompt_tokens": 10,
        "completion_tokens": 100,
        "cost_usd": 0.01,
        "status": "ok",
        "at": 1000.0 + i,
    }
    return UsageRecord.model_validate({**base, **fields})


def state(worker: str, **fields: Any) -> WorkerState:
    base: dict[str, Any] = {"worker_id": worker, "model": "m", "k_desired": 4, "k_applied": 4, "accepted_length": 3.0}
    return WorkerState.model_validate({**base, **fields})


def test_quantiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert views.quantile(values, 0.5) == 50.0
    assert views.quantile(values, 0.99) == 99.0
    assert views.quantile([3.0], 0.99) == 3.0
    assert views.quantile([], 0.5) is None


def test_fleet_rows_carry_pool_mode_phase_and_the_workers_own_tpot() -> None:
    workers = [
        {"id": "w0", "model": "m", "healthy": True, "in_flight": 2, "state": state("w0").model_dump(), "mode": None},
        {
            "id": "w1",
            "model": "m",
            "healthy": True,
            "in_flight": 0,
            "state": None,
            "mode": {"worker_id": "w1", "mode": "drafter-free", "phase": "draining", "since": 1, "mode_since": 1},
        },
    ]
    records = [record(i, worker_id="w0", tpot_s=0.01 * (i + 1)) for i in range(10)] + [record(99, worker_id="w1")]
    plan = FleetPlan(
        model="m", version=3, issued_at=0.0, ttl_s=60.0, pools=[PoolPlan(name="fast", classes=["a/*"], workers=["w0"])]
    )
    w0, w1 = views.fleet_rows(workers, records, {"m": plan})
    assert (w0.pool, w0.mode, w0.phase, w0.requests) == ("fast", "drafter", "serving", 10)
    assert (w0.tpot_p50_s, w0.tpot_p99_s) == (0.05, 0.1)
    assert (w1.pool, w1.mode, w1.phase, w1.tpot_p50_s, w1.requests) == (None, "drafter-free", "draining", None, 1)
    assert w0.state is not None
    assert w0.state.k_applied == 4


def test_tier_attainment_is_the_share_of_ok_requests_within_each_target() -> None:
    tiers = {"gold": TierConfig(tpot_target_s=0.05, ttft_target_s=1.0), "batch": TierConfig()}
    records = [
        record(0, tier="gold", tpot_s=0.04, ttft_s=0.5),
        record(1, tier="gold", tpot_s=0.06, ttft_s=0.5),
        record(2, tier="gold", tpot_s=0.05, ttft_s=2.0),
        record(3, tier="gold", tpot_s=0.01, ttft_s=0.1, status="error"),
        record(4, tier="batch", tpot_s=1.0),
    ]
    batch, gold = views.tier_rows(tiers, records, changed=["gold"])
    assert (gold.name, gold.requests, gold.changed) == ("gold", 3, True)
    assert gold.tpot_met == 2 / 3
    assert gold.ttft_met == 2 / 3
    assert (batch.requests, batch.tpot_met, batch.ttft_met, batch.changed) == (1, None, None, False)


def test_costs_per_tenant_and_model_weight_each_workers_split_by_cost() -> None:
    states = {
        "w0": state("w0", usd_per_mtok=2.0, usd_per_mtok_k0=4.0, drafter_share=0.2),
        "w1": state("w1", usd_per_mtok=2.0, usd_per_mtok_k0=1.0, drafter_share=0.6),
    }
    records = [
        record(0, worker_id="w0", cost_usd=0.3, completion_tokens=1000),
        record(1, worker_id="w1", cost_usd=0.1, completion_tokens=1000),
        record(2, tenant="other", model="m2", worker_id="gone", cost_usd=0.2, completion_tokens=500),
    ]
    acme, other = views.cost_rows(records, states)
    assert (acme.tenant, acme.model, acme.requests, acme.completion_tokens) == ("acme", "m", 2, 2000)
    assert acme.usd_per_mtok == (0.3 + 0.1) / 2000 * 1e6
    assert acme.drafter_share == (0.3 * 0.2 + 0.1 * 0.6) / 0.4
    assert acme.usd_per_mtok_k0 == (0.3 * 2.0 + 0.1 * 0.5) / 2000 * 1e6
    assert (other.drafter_share, other.usd_per_mtok_k0) == (None, None)


def test_usage_series_buckets_spend_and_the_sparkline_scales_it() -> None:
    records = [record(0, at=0.5, cost_usd=1.0), record(1, at=3.5, cost_usd=2.0), record(2, at=9.0, cost_usd=5.0)]
    series = views.usage_series(records, since=0.0, until=4.0, buckets=4)
    assert series == [1.0, 0.0, 0.0, 2.0]
    points = views.sparkline(series, width=30, height=10).split()
    assert points == ["0.0,5.0", "10.0,10.0", "20.0,10.0", "30.0,0.0"]
    assert views.sparkline([]) == ""


def test_forms_become_admin_api_bodies_with_blanks_as_null() -> None:
    form = forms.parse_form(b"id=acme&tier=gold&models=m1%2C+m2&rpm=&tpm=100&budget_usd=5&csrf=x")
    assert forms.tenant_body(form, create=True) == {
        "id": "acme",
        "tier": "gold",
        "models": ["m1", "m2"],
        "rpm": None,
        "tpm": "100",
        "budget_usd": "5",
    }
    assert "id" not in forms.tenant_body(form, create=False)
    tier = forms.tier_body(forms.parse_form(b"priority=2&ttft_target_s=&tpot_target_s=0.05&speculation=speed"))
    assert tier == {
        "priority": "2",
        "ttft_target_s": None,
        "tpot_target_s": "0.05",
        "speculation": "speed",
        "sheddable": False,
    }
    assert forms.tier_body({"sheddable": "on"})["sheddable"] is True
