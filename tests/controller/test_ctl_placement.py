"""Fleet placement in the controller (``controller.placement``): following a pool's gear while the safety paths
win, measuring classes and their acceptance from the ledger, planning and publishing, and — with one class —
running exactly as without placement."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
from rich.console import Console

from bench.policy.controller_lab import lab_controller, run_lab
from controller.metrics import ControllerMetrics
from controller.placement import (
    FleetPlacement,
    PlacementConfig,
    WorkerSample,
    obey_pool,
    planner_input,
    worker_gears,
)
from controller.planner import prior_accepted_length
from controller.policy import PolicyConfig, decide
from controller.settings import ControllerSettings
from controller.stabiliser import Action, ActionKind, StabiliserState
from fleet.clock import ManualClock
from fleet.config import CommonSettings, SpeculationMode, TenantConfig, TenantsConfig, TierConfig
from fleet.perf import Profile
from fleet.plan import ClassForecast, FleetPlan, PoolPlan, publish_plan, read_plans
from fleet.store.memory import MemoryStore
from fleet.store.protocol import UsageRecord
from fleet.store.redis import RedisStore
from gearshift.cli.explain_plan import plans_view, stored_plans
from workers.sim.arrivals import Lengths, Phase, PhasedLoad, WorkloadMix
from workers.sim.virtual import VirtualLab, VirtualWorker, make_worker

from .ctl_helpers import make_estimate

TENANTS = TenantsConfig(
    tiers={"interactive": TierConfig(tpot_target_s=0.05), "batch": TierConfig(priority=10)},
    tenants=(TenantConfig(id="chatty", tier="interactive"), TenantConfig(id="bulk", tier="batch", workload="maths")),
)
MODEL = "kimi-k3"
MIX = WorkloadMix.single("maths", Lengths(200, 0.3), Lengths(300, 0.3))
NOW = 100.0


def pool(k: int | None, name: str = "p") -> PoolPlan:
    return PoolPlan(name=name, classes=["batch/maths"], workers=["w0"], k=k)


def record(i: int, *, tenant: str, tier: str, workload: str | None, worker: str, tokens: int, at: float) -> UsageRecord:
    return UsageRecord(
        request_id=f"r{i}", tenant=tenant, model=MODEL, worker_id=worker, prompt_tokens=100,
        completion_tokens=tokens, cost_usd=0.0, status="ok", at=at, tier=tier, workload=workload,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------ obey_pool
def test_a_pool_gear_is_taken_at_once_going_down(lab_profile: Profile) -> None:
    est = make_estimate(lab_profile)
    decision = decide(est, lab_profile, tpot_target_s=None, config=PolicyConfig())
    state = StabiliserState(k=4, since_s=NOW - 1)
    new, action = obey_pool(state, Action(4, ActionKind.HOLD, "x"), decision, est, pool(2), now=NOW, min_dwell_s=10)
    assert (new.k, new.since_s, action.kind, action.k) == (2, NOW, ActionKind.PLAN, 2)
    same, held = obey_pool(new, Action(2, ActionKind.HOLD, "x"), decision, est, pool(2), now=NOW + 2, min_dwell_s=10)
    assert (same.k, held.kind) == (2, ActionKind.HOLD)


def test_going_up_to_the_pool_gear_waits_for_the_dwell(lab_profile: Profile) -> None:
    est = make_estimate(lab_profile, k_current=1)
    decision = decide(est, lab_profile, tpot_target_s=None, config=PolicyConfig())
    state = StabiliserState(k=1, since_s=NOW - 3)
    hold = Action(1, ActionKind.HOLD, "x")
    new, action = obey_pool(state, hold, decision, est, pool(6), now=NOW, min_dwell_s=10)
    assert (new.k, action.kind) == (1, ActionKind.HOLD)
    new, action = obey_pool(state, hold, decision, est, pool(6), now=NOW + 8, min_dwell_s=10)
    assert (new.k, action.kind) == (6, ActionKind.PLAN)


def test_a_k0_pool_serving_speculation_off_never_probes(lab_profile: Profile) -> None:
    est = make_estimate(lab_profile, k_current=0)
    decision = decide(est, lab_profile, tpot_target_s=None, config=PolicyConfig())
    probe = Action(4, ActionKind.PROBE, "neighbour probe")
    state = StabiliserState(k=0, since_s=0.0)
    # Without a speculation-off tier the loop may explore the pool's k = 0 (a probe passes) …
    assert obey_pool(state, probe, decision, est, pool(0), now=NOW, min_dwell_s=0) == (state, probe)
    # … with one, the probe is refused, and one already running is ended at once.
    new, action = obey_pool(state, probe, decision, est, pool(0), now=NOW, min_dwell_s=0, no_drafts=True)
    assert (new.k, new.probe_until_s, action.k, action.kind) == (0, None, 0, ActionKind.HOLD)
    running = StabiliserState(k=4, since_s=NOW - 1, probe_until_s=NOW + 3)
    new, action = obey_pool(running, Action(4, ActionKind.HOLD, "probing"), decision, est, pool(0), now=NOW,
                            min_dwell_s=0, no_drafts=True)  # fmt: skip
    assert (new.k, new.probe_until_s, action.k, action.kind) == (0, None, 0, ActionKind.PLAN)
    off = TenantsConfig(tiers={"batch": TierConfig(speculation=SpeculationMode.OFF)}, tenants=())
    placement = FleetPlacement(PlacementConfig(), store=MemoryStore(), clock=ManualClock(NOW), tenants=off,
                               metrics=ControllerMetrics())  # fmt: skip
    assert placement.serves_off(pool(0))
    assert not FleetPlacement(PlacementConfig(), store=MemoryStore(), clock=ManualClock(NOW), tenants=TENANTS,
                              metrics=ControllerMetrics()).serves_off(pool(0))  # fmt: skip


@pytest.mark.parametrize(
    "case", ["kv", "collapse", "stale", "no-window", "probing", "probe-starts", "reprobe-pending", "free-pool"]
)
def test_the_safety_paths_and_a_free_pool_leave_the_loop_alone(lab_profile: Profile, case: str) -> None:
    est = make_estimate(lab_profile)
    state = StabiliserState(k=4, since_s=0.0)
    action = Action(4, ActionKind.HOLD, "loop")
    if case == "kv":
        est = replace(est, kv_usage=0.97)
    elif case == "collapse":
        est = replace(est, accepted_length=1.02)
    elif case == "stale":
        est = replace(est, stale=True, stale_for_s=30.0)
    elif case == "no-window":
        est = replace(est, windows=0)
    elif case == "probing":
        state = replace(state, probe_until_s=NOW + 2)
    elif case == "probe-starts":
        action = Action(8, ActionKind.PROBE, "probe")
    elif case == "reprobe-pending":
        state = replace(state, reprobe_at_s=NOW + 30)
    decision = decide(est, lab_profile, tpot_target_s=None, config=PolicyConfig())
    target = pool(None) if case == "free-pool" else pool(1)
    assert obey_pool(state, action, decision, est, target, now=NOW, min_dwell_s=0) == (state, action)


def test_worker_gears_keep_the_tiers_within_k_max_that_run_at_full_speed() -> None:
    assert worker_gears((0, 1, 2, 4, 8), 4, None) == (0, 1, 2, 4)
    assert worker_gears((0, 1, 2, 4, 8), 8, ((0, 1, 32), (2, 1, 16), (8, 1, 4))) == (0, 2, 8)


# --------------------------------------------------------------------------------------- planner input
def samples(profile: Profile, **estimates: float) -> list[WorkerSample]:
    """Workers w0, w1 at k = 4 observing ``estimates[worker]`` tokens per request-step."""
    return [
        WorkerSample(
            worker_id=w,
            model=MODEL,
            profile=profile,
            max_num_seqs=64,
            gears=(0, 2, 4),
            estimate=make_estimate(profile, worker_id=w, accepted_length=al),
        )
        for w, al in estimates.items()
    ]


def test_classes_are_measured_from_the_ledger_with_their_acceptance(lab_profile: Profile) -> None:
    records = [
        *(record(i, tenant="chatty", tier="interactive", workload="chat", worker="w0", tokens=50, at=NOW)
          for i in range(30)),
        *(record(100 + i, tenant="bulk", tier="batch", workload="maths", worker="w1", tokens=400, at=NOW)
          for i in range(10)),
    ]  # fmt: skip
    built = planner_input(
        MODEL, samples(lab_profile, w0=1.5, w1=4.0), records, tenants=TENANTS, window_s=60.0, now=NOW,
        max_classes=16, current=None, current_since=NOW,
    )  # fmt: skip
    assert built is not None
    inp, acceptance = built
    by_name = {c.name: c for c in inp.classes}
    assert set(by_name) == {"interactive/chat", "batch/maths"}
    chat = by_name["interactive/chat"]
    assert chat.rate_req_s == pytest.approx(30 / 60.0)
    assert (chat.prompt_tokens, chat.output_tokens) == (100, 50)
    assert chat.tier == TENANTS.tiers["interactive"]
    assert inp.gears == (0, 2, 4)
    assert inp.workers == ("w0", "w1")
    prior = prior_accepted_length(lab_profile, "chat", 100 + 0.5 * 50)
    assert chat.accepted_length[4] < prior[4], "w0 served only chat and saw less acceptance than the prior"
    assert acceptance["interactive/chat"][0] == chat.accepted_length
    assert acceptance["interactive/chat"][1] == chat.accepted_length_sd > 0


def test_without_traffic_there_is_no_input_and_only_the_busiest_classes_are_planned(lab_profile: Profile) -> None:
    def measured(records: list[UsageRecord], max_classes: int) -> list[str] | None:
        built = planner_input(
            MODEL, samples(lab_profile, w0=2.0), records, tenants=TENANTS, window_s=60.0, now=NOW,
            max_classes=max_classes, current=None, current_since=NOW,
        )  # fmt: skip
        return None if built is None else [c.name for c in built[0].classes]

    assert measured([], 4) is None
    counts = {"wl2": 3, "wl0": 5, "wl1": 4}
    records = [
        record(i, tenant="chatty", tier="interactive", workload=wl, worker="w0", tokens=10, at=NOW)
        for wl, n in counts.items()
        for i in range(n)
    ]
    assert measured(records, 2) == ["interactive/wl0", "interactive/wl1"]
    assert measured(records, 4) == ["interactive/wl0", "interactive/wl1", "interactive/wl2"]


# ------------------------------------------------------------------------------------------- planning
async def test_the_leader_plans_every_period_and_publishes(lab_profile: Profile) -> None:
    clock = ManualClock(NOW)
    store = MemoryStore(clock=clock)
    cfg = PlacementConfig(period_s=10.0, min_dwell_s=0.0)
    metrics = ControllerMetrics()
    placement = FleetPlacement(cfg, store=store, clock=clock, tenants=TENANTS, metrics=metrics)
    for i in range(20):
        await store.append_usage(
            record(i, tenant="chatty" if i % 2 else "bulk", tier="interactive" if i % 2 else "batch",
                   workload="chat" if i % 2 else "maths", worker=f"w{i % 2}", tokens=100, at=NOW)
        )  # fmt: skip
    workers = samples(lab_profile, w0=3.0, w1=2.0)
    await placement.tick(workers)
    assert await read_plans(store) == {}, "not before the first period"
    clock.advance(10.0)
    await placement.tick(workers)
    plan = (await read_plans(store))[MODEL]
    assert plan.version == 1
    assert plan.issued_at == clock.wall()
    assert sorted(w for p in plan.pools for w in p.workers) == ["w0", "w1"]
    assert {"accepted_length/interactive/chat", "accepted_length_sd/batch/maths"} <= set(plan.predicted)
    assert metrics.registry.get_sample_value("gearshift_controller_plan_version", {"model": MODEL}) == 1
    for p in plan.pools:
        for w in p.workers:
            labels = {"worker": w, "pool": p.name}
            assert metrics.registry.get_sample_value("gearshift_controller_worker_pool", labels) == 1
    found = placement.pool_of("w0", MODEL)
    assert found is not None
    clock.advance(cfg.ttl_s + 1)
    assert placement.pool_of("w0", MODEL) is None, "a stale plan is not followed"


async def test_a_new_leader_continues_the_published_plan(lab_profile: Profile) -> None:
    clock = ManualClock(NOW)
    store = MemoryStore(clock=clock)
    earlier = FleetPlan(
        model=MODEL, version=7, issued_at=NOW, ttl_s=90.0,
        pools=[PoolPlan(name="shared", classes=["batch/maths"], workers=["w0", "w1"])],
    )  # fmt: skip
    await publish_plan(store, earlier)
    await store.append_usage(record(1, tenant="bulk", tier="batch", workload="maths", worker="w0", tokens=9, at=NOW))
    placement = FleetPlacement(
        PlacementConfig(period_s=1.0), store=store, clock=clock, tenants=TENANTS, metrics=ControllerMetrics()
    )
    clock.advance(1.0)
    await placement.tick(samples(lab_profile, w0=3.0, w1=3.0))
    assert placement.plans[MODEL].version >= earlier.version


# ------------------------------------------------------------------------------------------ closed loop
def lab(profile: Profile, n: int) -> tuple[ManualClock, VirtualLab, list[VirtualWorker]]:
    clock = ManualClock()
    workers = [make_worker(profile, f"w{i}", clock, k=8, seed=i + 1, model_name=MODEL) for i in range(n)]
    return clock, VirtualLab(workers, PhasedLoad([Phase(1000, MIX, concurrency=2)]), clock=clock), workers


async def test_each_worker_runs_its_pool_gear(lab_profile: Profile) -> None:
    clock, vlab, workers = lab(lab_profile, 2)
    ctl = lab_controller(workers, lab_profile, clock, tenants=TENANTS)
    assert ctl.placement is not None
    ctl.placement.plans[MODEL] = FleetPlan(
        model=MODEL, version=1, issued_at=clock.wall(), ttl_s=1000.0,
        pools=[PoolPlan(name="fast", classes=["interactive/chat"], workers=["w0"], k=6),
               PoolPlan(name="bulk", classes=["batch/maths"], workers=["w1"], k=1)],
    )  # fmt: skip
    await run_lab(vlab, ctl, until_s=30, tick_s=2)
    assert [w.control.k_for(1) for w in workers] == [6, 1]
    assert ctl.workers["w1"].action is not None
    assert ctl.workers["w1"].action.reason == "plan: pool bulk k=1"


async def test_with_one_class_the_controller_runs_as_without_placement(lab_profile: Profile) -> None:
    traces, plans = [], []
    for enabled in (True, False):
        clock, vlab, workers = lab(lab_profile, 2)
        store = MemoryStore(clock=clock)
        for i in range(40):
            rec = record(i, tenant="bulk", tier="batch", workload="maths", worker=f"w{i % 2}", tokens=300,
                         at=clock.wall())  # fmt: skip
            await store.append_usage(rec)
        settings = ControllerSettings(placement=PlacementConfig(enabled=enabled, period_s=4.0, min_dwell_s=0.0))
        ctl = lab_controller(workers, lab_profile, clock, tenants=TENANTS, store=store, settings=settings)
        traces.append((await run_lab(vlab, ctl, until_s=40, tick_s=2)).ticks)
        plans.append(await read_plans(store))
    assert traces[0] == traces[1]
    assert [len(p[MODEL].pools) for p in plans[:1]] == [1], "the planner ran and kept one pool"
    assert plans[1] == {}


# ------------------------------------------------------------------------------------------------ explain
@pytest.mark.redis
async def test_explain_shows_the_stored_plan_its_acceptance_and_why(redis_url: str) -> None:
    prefix = f"test:{uuid.uuid4().hex[:12]}:"
    store = RedisStore.from_url(redis_url, prefix=prefix)
    plan = FleetPlan(
        model=MODEL, version=4, issued_at=NOW, ttl_s=30.0, reason="split: batch maths off the chat workers",
        pools=[PoolPlan(name="fast", classes=["interactive/chat"], workers=["w0"], k=6),
               PoolPlan(name="bulk", classes=["batch/maths"], workers=["w1"], k=1, max_concurrency=48)],
        predicted={"goodput_tok_s": 1234.0, "tpot_s/fast/interactive/chat": 0.031, "batch/fast": 3.5,
                   "accepted_length/interactive/chat": 2.75, "accepted_length_sd/interactive/chat": 0.08},
    )  # fmt: skip
    await publish_plan(store, plan)
    await store.close()
    plans = await stored_plans(CommonSettings(redis_url=redis_url, key_prefix=prefix))
    assert plans == {MODEL: plan}

    def text(now: float, shown: dict[str, FleetPlan] = plans) -> str:
        console = Console(width=160, record=True, color_system=None)
        console.print(plans_view(shown, now=now))
        return console.export_text()

    fresh = text(NOW + 5)
    for expected in ("version 4", "fresh", "fast", "w0", "interactive/chat", "48", "31.0 ms", "2.75", "8%",
                     "1234 tok/s", "why: split: batch maths off the chat workers"):  # fmt: skip
        assert expected in fresh, expected
    assert "STALE" in text(NOW + 31)
    assert "none in the store" in text(NOW, {})


def test_explain_shows_drafter_mode_k_cap_worker_caps_and_the_forecast() -> None:
    """Issue 25: the plan record's new fields, and the forecast each pool was sized for, in ``controller explain``."""
    plan = FleetPlan(
        model=MODEL, version=5, issued_at=NOW, ttl_s=30.0, reason="batch pool drafter-free",
        pools=[PoolPlan(name="fast", classes=["interactive/chat"], workers=["w0", "w1"], k_cap=5,
                        worker_caps={"w1": 24},
                        forecast={"interactive/chat": ClassForecast(rate_rps=1.5, upper_rps=2.25, prompt_tokens=800,
                                                                    output_tokens=300)}),
               PoolPlan(name="bulk", classes=["batch/*"], workers=["w2"], k=0, drafter="off")],
    )  # fmt: skip
    console = Console(width=200, record=True, color_system=None)
    console.print(plans_view({MODEL: plan}, now=NOW + 1))
    shown = console.export_text()
    for expected in ("its loop ≤ 5", "w1 24", "off", "loaded", "forecast the pools were sized for", "2.25", "800"):
        assert expected in shown, expected


async def test_the_plan_is_sized_for_the_forecast_and_knows_each_workers_mode(lab_profile: Profile) -> None:
    # Arrivals rising window by window over ten minutes: the forecast's upper edge, not the last two minutes'
    # mean, is what the plan is sized for, and each pool records it.
    clock = ManualClock(NOW + 600.0)
    store = MemoryStore(clock=clock)
    cfg = PlacementConfig(period_s=10.0, min_dwell_s=0.0)
    placement = FleetPlacement(cfg, store=store, clock=clock, tenants=TENANTS, metrics=ControllerMetrics())
    i = 0
    for window in range(10):
        for _ in range(6 * (window + 1)):
            at = NOW + 60.0 * window + (i % 60)
            await store.append_usage(
                record(i, tenant="bulk", tier="batch", workload="maths", worker="w0", tokens=100, at=at)
            )
            i += 1
    workers = [replace(s, movable=True) for s in samples(lab_profile, w0=3.0, w1=2.0)]
    workers[1] = replace(workers[1], drafter_loaded=False)
    clock.advance(10.0)
    await placement.tick(workers)
    predicted = placement.forecasts[MODEL]["batch/maths"]
    assert predicted.trend_rps_per_s > 0
    recent = await store.ledger(since=clock.wall() - cfg.class_window_s, until=clock.wall(), limit=10_000)
    measured = len(recent) / cfg.class_window_s  # the rate over the last class window
    assert predicted.upper_rps > predicted.rate_rps > measured
    plan = (await read_plans(store))[MODEL]
    assert all(p.forecast["batch/maths"] == predicted.record() for p in plan.pools if p.serves("batch/maths"))
    built = planner_input(
        MODEL, workers, await store.ledger(since=NOW, until=clock.wall(), limit=10_000), tenants=TENANTS,
        window_s=cfg.class_window_s, now=clock.wall(), max_classes=16, current=None, current_since=NOW,
        forecasts=placement.forecasts[MODEL],
    )  # fmt: skip
    assert built is not None
    inp = built[0]
    assert inp.modes == {"w0": "loaded", "w1": "off"}
    assert inp.movable == frozenset({"w0", "w1"})
    assert inp.restart_s == (lab_profile.serving.restart_s or 0.0)
    by_name = {c.name: c for c in inp.classes}
    assert by_name["batch/maths"].rate_req_s == pytest.approx(measured)
    assert inp.forecast["batch/maths"].upper_rps == predicted.upper_rps
    w1_pool = plan.pool_of_worker("w1")
    assert w1_pool is not None
    assert placement.planned_drafter("w1", MODEL) == (w1_pool.drafter == "loaded")
