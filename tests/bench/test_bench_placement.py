"""Fleet placement in the lab: the hindsight search against brute force, a static placement's routing, and the
fleet planner online (one class: today's controller; a mixed overload: pools that follow the plan)."""

from __future__ import annotations

import itertools

import pytest

from bench.policy import placement
from bench.policy.fleet_placement import FleetPlacementPolicy, StaticPlacement
from bench.policy.lab import run_policy
from bench.policy.policies import ControllerPolicy
from bench.policy.run_metrics import summarise
from bench.policy.scenario import Scenario
from controller.planner import BATCH_POOL, INTERACTIVE_POOL, PlannerConfig, evaluate_pool
from fleet.clock import ManualClock
from fleet.perf import load_profile

MI355X = load_profile("kimi-k3-dspark-mi355x-tp8")
CHAT: dict[str, object] = {
    "workload": "chat",
    "tier": "interactive",
    "prompt_tokens": {"mean": 1500},
    "output_tokens": {"mean": 400},
}
RANDOM: dict[str, object] = {
    "workload": "random",
    "tier": "batch",
    "prompt_tokens": {"mean": 1024},
    "output_tokens": {"mean": 800},
}


def _scenario(rate: float, mix: list[dict[str, object]], *, workers: int, duration_s: float = 100.0) -> Scenario:
    return Scenario.model_validate(
        {
            "name": "tiny-placement",
            "description": "a mixed Poisson load",
            "workers": workers,
            "seed": 5,
            "warmup_s": 20,
            "phases": [{"name": "p", "duration_s": duration_s, "arrival": {"kind": "poisson", "rate_per_s": rate},
                        "mix": mix}],
        }
    ).on(MI355X)  # fmt: skip


def test_search_finds_the_brute_force_optimum(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a two-worker case small enough to enumerate every (shares, k_a, k_b) jointly, the search's best
    placement predicts exactly the joint optimum (the pools are independent, so choosing each one's k apart is
    exact), and the search reports the size of the space it covered."""
    monkeypatch.setattr(placement, "CAPS", (None,))
    monkeypatch.setattr(placement, "SHARE_STEPS", 4)
    sc = _scenario(7.0, [CHAT, RANDOM], workers=2)
    classes = placement.scenario_loads(sc, MI355X)
    cfg, seqs, steps = PlannerConfig(), sc.seqs, placement.SHARE_STEPS
    gears = range(MI355X.drafter.k_max + 1)
    best = 0.0
    for shares in itertools.product(range(steps + 1), repeat=len(classes)):
        if len(set(shares)) == 1 and shares[0] in (0, steps):
            continue
        a = [(c, c.rate_req_s * s / steps) for c, s in zip(classes, shares, strict=True)]
        b = [(c, c.rate_req_s * (steps - s) / steps) for c, s in zip(classes, shares, strict=True)]
        for k_a, k_b in itertools.product(gears, gears):
            good = evaluate_pool(MI355X, a, workers=1, k=k_a, cap=seqs, cfg=cfg).goodput_tok_s
            good += evaluate_pool(MI355X, b, workers=1, k=k_b, cap=seqs, cfg=cfg).goodput_tok_s
            best = max(best, good)
    (top,) = placement.search(sc, MI355X, top=1)
    assert top.predicted_tok_s == pytest.approx(best, rel=1e-9)
    assert placement.search_size(2, 2, len(gears), seqs) == (steps + 1) ** 2 * len(gears) ** 2


def test_a_static_placement_routes_each_class_by_its_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement, "CAPS", (None,))
    sc = _scenario(3.0, [CHAT, RANDOM], workers=3, duration_s=30.0)
    (choice,) = placement.search(sc, MI355X, top=1)
    policy = StaticPlacement("static", choice.plan.model_copy(update={"model": "kimi-k3"}), choice.shares)
    raw = run_policy(sc, policy, profile=MI355X, priced=False)
    pools = {p.name: set(p.workers) for p in choice.plan.pools}
    for r in raw.records.requests:
        share = choice.shares[f"{r.tag}/{r.workload}"]
        allowed = set().union(*(pools[name] for name, s in share.items() if s > 0))
        assert r.worker_id in allowed
    ks = {p.name: p.k for p in choice.plan.pools}
    for s in raw.records.steps:
        if s.decode_seqs:
            wid = f"w{s.worker}"
            assert s.k == next(ks[name] for name, members in pools.items() if wid in members)


def test_one_class_fleet_placement_is_the_controller() -> None:
    sc = _scenario(2.0, [CHAT], workers=2, duration_s=60.0)
    fp, ctl = FleetPlacementPolicy(), ControllerPolicy()
    a = summarise(run_policy(sc, fp, profile=MI355X, priced=False), MI355X)
    b = summarise(run_policy(sc, ctl, profile=MI355X, priced=False), MI355X)
    assert fp.plans
    assert all(len(p.pools) == 1 and p.pools[0].k is None for p in fp.plans)
    assert a.goodput_tok_s == b.goodput_tok_s
    assert [t.k for t in a.ticks] == [t.k for t in b.ticks]


def test_a_mixed_overload_is_split_and_the_requests_follow_the_plan() -> None:
    sc = _scenario(14.0, [CHAT, RANDOM], workers=4, duration_s=60.0)
    fp = FleetPlacementPolicy()
    raw = run_policy(sc, fp, profile=MI355X, priced=False)
    split = next(p for p in fp.plans if len(p.pools) == 2)
    at = split.issued_at - ManualClock().wall()  # the lab's clock starts at ManualClock's default epoch
    pools = {p.name: p for p in split.pools}
    inter, batch = set(pools[INTERACTIVE_POOL].workers), set(pools[BATCH_POOL].workers)
    later = [r for r in raw.records.requests if r.arrival_s > at and r.arrival_s < at + fp.config.min_dwell_s]
    assert later
    # Interactive work stays home (its pool is never at its cap here); batch work is home or spilled, one way.
    assert all(r.worker_id in inter for r in later if r.tag == "interactive")
    assert any(r.worker_id in batch for r in later if r.tag == "batch")
    for s in raw.records.steps:
        wid = f"w{s.worker}"
        if s.decode_seqs and at + 1.0 < s.start_s < at + fp.config.min_dwell_s:
            assert s.k == (pools[INTERACTIVE_POOL].k if wid in inter else pools[BATCH_POOL].k)
