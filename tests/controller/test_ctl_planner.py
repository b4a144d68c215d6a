"""The fleet planner (controller/planner.py): one pool where placement has nothing to choose, a split with the
gears its model prefers under a mixed overload, hysteresis and minimum dwell, and the per-class acceptance."""

from __future__ import annotations

from dataclasses import replace

from controller.planner import (
    BATCH_POOL,
    INTERACTIVE_POOL,
    SHARED_POOL,
    ClassLoad,
    PlannerConfig,
    PlannerInput,
    WorkerAcceptance,
    estimate_acceptance,
    evaluate_pool,
    plan_fleet,
    prior_accepted_length,
)
from fleet.config import TierConfig
from fleet.perf import load_profile
from fleet.plan import FleetPlan

MI355X = load_profile("kimi-k3-dspark-mi355x-tp8")
INTERACTIVE = TierConfig(priority=0, ttft_target_s=2.0, tpot_target_s=0.05)
BATCH = TierConfig(priority=10)
WORKERS = ("w0", "w1", "w2", "w3")


def _chat(rate: float) -> ClassLoad:
    return ClassLoad("interactive/chat", INTERACTIVE, rate, 1500, 400, prior_accepted_length(MI355X, "chat", 1700))


def _random(rate: float) -> ClassLoad:
    return ClassLoad("batch/random", BATCH, rate, 1024, 800, prior_accepted_length(MI355X, "random", 1424))


def _input(
    *classes: ClassLoad,
    workers: tuple[str, ...] = WORKERS,
    current: FleetPlan | None = None,
    current_since: float = 0.0,
) -> PlannerInput:
    return PlannerInput(
        "kimi-k3", workers, MI355X, classes, now=1000.0, max_num_seqs=MI355X.serving.max_num_seqs,
        current=current, current_since=current_since,
    )  # fmt: skip


def test_one_class_or_one_worker_is_one_pool_run_by_the_loops() -> None:
    for inp in (_input(_chat(7.0)), _input(_chat(7.0), _random(7.0), workers=("w0",))):
        plan = plan_fleet(inp)
        assert [p.name for p in plan.pools] == [SHARED_POOL]
        (pool,) = plan.pools
        assert pool.k is None
        assert pool.max_concurrency is None
        assert sorted(pool.workers) == sorted(inp.workers)
        assert sorted(pool.classes) == sorted(c.name for c in inp.classes)


def test_a_mixed_overload_splits_with_each_pools_best_gear() -> None:
    cfg = PlannerConfig()
    inp = _input(_chat(7.2), _random(7.2))
    plan = plan_fleet(inp, cfg)
    pools = {p.name: p for p in plan.pools}
    assert set(pools) == {INTERACTIVE_POOL, BATCH_POOL}
    inter, batch = pools[INTERACTIVE_POOL], pools[BATCH_POOL]
    assert inter.classes == ["interactive/chat"]
    assert batch.classes == ["batch/random"]
    assert sorted(inter.workers + batch.workers) == sorted(WORKERS)
    assert inter.k is not None
    assert batch.k is not None
    # The batch pool runs the gear that serves the most of its load; on this profile random tokens at a large
    # batch want a shorter k than interactive chat within its TPOT target.
    loads = [(inp.classes[1], 7.2)]
    cap = batch.max_concurrency or inp.max_num_seqs
    served = {
        k: evaluate_pool(MI355X, loads, workers=len(batch.workers), k=k, cap=cap, cfg=cfg).throughput_tok_s
        for k in range(MI355X.drafter.k_max + 1)
    }
    assert served[batch.k] == max(served.values())
    assert batch.k < inter.k
    tpot = plan.predicted[f"tpot_s/{INTERACTIVE_POOL}/interactive/chat"]
    assert tpot <= (1 - cfg.tpot_margin) * 0.05
    shared = plan_fleet(_input(_chat(7.2), _random(7.2), current=None), replace(cfg, split_gain=10.0))
    assert plan.predicted["goodput_tok_s"] >= (1 + cfg.split_gain) * shared.predicted["goodput_tok_s"]


def test_below_the_knee_the_fleet_stays_shared() -> None:
    plan = plan_fleet(_input(_chat(2.0), _random(2.0)))
    assert [p.name for p in plan.pools] == [SHARED_POOL]


def test_dwell_and_hysteresis_keep_the_current_plan() -> None:
    cfg = PlannerConfig()
    split = plan_fleet(_input(_chat(7.2), _random(7.2)), cfg)
    assert len(split.pools) == 2
    # The mix turns to batch-heavy, where the split is far from best: within the dwell it is kept (same version) …
    heavy = (_chat(1.0), _random(12.0))
    young = plan_fleet(_input(*heavy, current=split, current_since=1000.0 - 10.0), cfg)
    assert young.pools == split.pools
    assert young.version == split.version
    assert "dwell" in young.reason
    # … after it, the plan changes, and the version grows by one.
    old = plan_fleet(_input(*heavy, current=split, current_since=0.0), cfg)
    assert old.pools != split.pools
    assert old.version == split.version + 1
    # An unchanged best plan is republished with its version.
    same = plan_fleet(_input(_chat(7.2), _random(7.2), current=split, current_since=0.0), cfg)
    assert same.pools == split.pools
    assert same.version == split.version
    # Where the split still serves the whole (light) load, one pool would predict no more: the split is kept
    # (hysteresis) past its dwell rather than moving the fleet for nothing.
    light = plan_fleet(_input(_chat(0.5), _random(3.0), current=split, current_since=0.0), cfg)
    assert light.pools == split.pools
    assert "within" in light.reason
    assert [p.name for p in plan_fleet(_input(_chat(0.5), _random(3.0)), cfg).pools] == [SHARED_POOL]


def test_acceptance_per_class_from_pure_and_mixed_workers() -> None:
    priors = {"a": (1.0, 1.8, 2.4), "b": (1.0, 1.5, 1.9)}
    # Class a accepts 20 % more drafts than its prior, class b 10 % fewer; each worker's counters blend its mix.
    truth = {"a": 1.2, "b": 0.9}

    def worker(k: int, share_a: float) -> WorkerAcceptance:
        shares = {"a": share_a, "b": 1 - share_a}
        per_step = sum(s * (priors[c][k] - 1) * truth[c] for c, s in shares.items())
        return WorkerAcceptance(k, per_step, {c: s for c, s in shares.items() if s > 0})

    est = estimate_acceptance(priors, [worker(2, 1.0), worker(2, 1.0), worker(1, 0.0), worker(2, 0.0)])
    for c in priors:
        al, sd = est[c]
        assert abs((al[2] - 1) / (priors[c][2] - 1) - truth[c]) < 1e-9
        assert sd < 1e-9
    unseen = estimate_acceptance(priors, [], prior_sd=0.2)
    assert unseen["a"] == (priors["a"], 0.2)
