"""The fleet plan in the lab (``bench.policy.fleet_plan_lab``): the lab's finished requests reach the controller's
ledger once each, and the real controller plans from them, sized for its forecast, and the lab routes by it."""

from __future__ import annotations

import asyncio

from bench.policy.fleet_plan_lab import FleetPlanPolicy
from bench.policy.lab import run_policy
from bench.policy.scenario import Scenario
from fleet.perf import load_profile

SCENARIO = Scenario.model_validate(
    {
        "name": "plan-lab-test",
        "description": "2 workers, interactive chat + batch random, Poisson, 120 s",
        "profile": "kimi-k3-dspark-mi355x-tp8",
        "workers": 2,
        "seed": 5,
        "mixed": True,
        "phases": [
            {
                "name": "only",
                "duration_s": 120,
                "arrival": {"kind": "poisson", "rate_per_s": 1.0},
                "mix": [
                    {"workload": "chat", "tier": "interactive", "weight": 1, "prompt_tokens": {"mean": 500},
                     "output_tokens": {"mean": 100}},
                    {"workload": "random", "tier": "batch", "weight": 1, "prompt_tokens": {"mean": 500},
                     "output_tokens": {"mean": 100}},
                ],
            }
        ],
    }
).on(load_profile("kimi-k3-dspark-mi355x-tp8"))  # fmt: skip


def test_the_ledger_gets_every_finished_request_once_and_the_plan_its_forecast() -> None:
    policy = FleetPlanPolicy(settings_overrides={"placement": {"period_s": 20.0, "min_dwell_s": 0.0}})
    run = run_policy(SCENARIO, policy)
    c = policy.controller
    assert c is not None
    assert c.placement is not None
    finished = [r for r in run.records.requests if r.finished]
    assert finished
    rows = asyncio.run(c.store.ledger(since=0.0, until=c.clock.wall() + 1.0, limit=100_000))
    assert sorted(r.request_id for r in rows) == sorted(r.request_id for r in finished)
    plan = next(iter(c.placement.plans.values()))
    forecasts = c.placement.forecasts[plan.model]
    assert set(forecasts) == {"interactive/chat", "batch/random"}
    recorded = {cls: f for p in plan.pools for cls, f in p.forecast.items()}
    assert recorded, "the plan records the forecast it was sized for"
    assert all(f.upper_rps >= f.rate_rps for f in recorded.values())
