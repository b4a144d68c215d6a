"""Loop behaviour on in-process simulated workers: stale workers, failing ticks, dry-run, canary, version
conflicts, and what is published to the store."""

from __future__ import annotations

import asyncio

import pytest

from bench.policy.controller_lab import lab_controller, run_lab
from controller.loop import Controller
from controller.settings import ControllerSettings
from fleet.clock import ManualClock
from fleet.config import TenantConfig, TenantsConfig, TierConfig
from fleet.perf import Profile
from fleet.speculation import SpeculationUpdate
from fleet.store.memory import MemoryStore
from fleet.store.protocol import UsageRecord
from gateway.settings import GatewaySettings
from workers.sim.arrivals import Lengths, Phase, PhasedLoad, WorkloadMix
from workers.sim.virtual import VirtualLab, VirtualWorker, make_worker

MIX = WorkloadMix.single("maths", Lengths(200, 0.3), Lengths(300, 0.3))


def lab(profile: Profile, n: int, concurrency: int) -> tuple[ManualClock, VirtualLab, list[VirtualWorker]]:
    clock = ManualClock()
    workers = [make_worker(profile, f"w{i}", clock, k=8, seed=i + 1) for i in range(n)]
    return clock, VirtualLab(workers, PhasedLoad([Phase(1000, MIX, concurrency=concurrency)]), clock=clock), workers


def sample(c: Controller, name: str, **labels: str) -> float:
    value = c.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


class Flaky:
    """Wraps a worker's renderer: raises ``error`` while ``broken``."""

    def __init__(self, worker: VirtualWorker, error: Exception) -> None:
        self.worker, self.error, self.broken = worker, error, False

    def __call__(self) -> bytes:
        if self.broken:
            raise self.error
        return self.worker.metrics_text()


async def test_a_worker_that_stops_answering_goes_stale_then_to_the_conservative_k(lab_profile: Profile) -> None:
    clock, vlab, workers = lab(lab_profile, 2, concurrency=2)
    flaky = Flaky(workers[1], ConnectionError("refused"))
    ctl = lab_controller(workers, lab_profile, clock, renderers={"w0": workers[0].metrics_text, "w1": flaky})
    await run_lab(vlab, ctl, until_s=20, tick_s=2)
    flaky.broken = True
    await run_lab(vlab, ctl, until_s=26, tick_s=2)
    w1 = ctl.workers["w1"]
    assert w1.estimate is not None
    assert w1.estimate.stale
    assert w1.action is not None
    assert w1.action.kind.value == "hold"
    assert sample(ctl, "gearshift_controller_worker_stale", worker="w1") == 1
    assert sample(ctl, "gearshift_controller_scrape_failures_total", worker="w1") == 3
    await run_lab(vlab, ctl, until_s=40, tick_s=2)
    assert workers[1].control.k_for(1) == ctl.settings.stabiliser.conservative_k
    states = await ctl.store.worker_states()
    assert states["w1"].stale
    assert not states["w0"].stale
    flaky.broken = False
    await run_lab(vlab, ctl, until_s=44, tick_s=2)
    assert sample(ctl, "gearshift_controller_worker_stale", worker="w1") == 0


async def test_an_unexpected_error_in_one_worker_never_stops_the_others(lab_profile: Profile) -> None:
    clock, vlab, workers = lab(lab_profile, 2, concurrency=2)
    flaky = Flaky(workers[1], ZeroDivisionError("bug"))
    flaky.broken = True
    ctl = lab_controller(workers, lab_profile, clock, renderers={"w0": workers[0].metrics_text, "w1": flaky})
    await run_lab(vlab, ctl, until_s=10, tick_s=2)
    assert ctl.workers["w1"].estimate is not None  # RenderSource turns any render failure into SourceError
    assert ctl.workers["w0"].estimate is not None
    assert not ctl.workers["w0"].estimate.stale


async def test_a_failing_tick_is_counted_and_backed_off(lab_profile: Profile) -> None:
    clock, _, workers = lab(lab_profile, 1, concurrency=1)

    class BrokenStore(MemoryStore):
        async def acquire_lease(self, name: str, holder: str, *, ttl_s: float) -> bool:
            raise ConnectionError("store down")

    ctl = lab_controller(workers, lab_profile, clock, store=BrokenStore(clock=clock))
    stop = asyncio.Event()
    started = clock.monotonic()

    async def stop_later() -> None:
        for _ in range(100_000):  # the loop's sleeps advance the manual clock; stop after 60 s of it
            if clock.monotonic() - started >= 60:
                break
            await asyncio.sleep(0)
        stop.set()

    await asyncio.gather(ctl.run(stop), stop_later())
    failures = sample(ctl, "gearshift_controller_tick_failures_total")
    assert 2 <= failures < 30, "backed off exponentially instead of retrying every tick"


async def test_dry_run_decides_but_never_applies(lab_profile: Profile) -> None:
    clock, vlab, workers = lab(lab_profile, 1, concurrency=64)
    ctl = lab_controller(workers, lab_profile, clock, settings=ControllerSettings(dry_run=True))
    await run_lab(vlab, ctl, until_s=80, tick_s=2)
    assert workers[0].control.version == 0
    assert workers[0].control.k_for(1) == 8
    assert sample(ctl, "gearshift_controller_k_desired", worker="w0") < 8
    assert sample(ctl, "gearshift_controller_k_applied", worker="w0") == 8


async def test_canary_moves_first_and_the_rest_follow_once_validated(lab_profile: Profile) -> None:
    clock, vlab, workers = lab(lab_profile, 2, concurrency=128)
    settings = ControllerSettings(canary_worker="w0", canary_ticks=4)
    ctl = lab_controller(workers, lab_profile, clock, settings=settings)
    first_move: dict[str, float] = {}
    t = 0.0
    while t < 120:
        t += 2
        await run_lab(vlab, ctl, until_s=t, tick_s=2)
        for w in workers:
            if w.control.k_for(1) != 8 and w.worker_id not in first_move:
                first_move[w.worker_id] = t
    assert set(first_move) == {"w0", "w1"}
    assert first_move["w1"] >= first_move["w0"] + settings.canary_ticks * 2
    assert ctl.canary is not None
    assert workers[1].control.k_for(1) in ctl.canary.validated


async def test_version_conflict_is_relearned(lab_profile: Profile) -> None:
    clock, vlab, workers = lab(lab_profile, 1, concurrency=64)
    ctl = lab_controller(workers, lab_profile, clock)
    await run_lab(vlab, ctl, until_s=4, tick_s=2)
    workers[0].control.apply(SpeculationUpdate(k=8, version=50, lease_seconds=600, reason="operator"))
    await run_lab(vlab, ctl, until_s=80, tick_s=2)
    assert workers[0].control.version > 50
    assert workers[0].control.k_for(1) < 8
    assert sample(ctl, "gearshift_controller_actuation_failures_total", worker="w0") >= 1


async def test_a_worker_whose_lease_lapsed_gets_a_new_version_not_a_conflict_loop(lab_profile: Profile) -> None:
    """An earlier controller applied version 1 and died; its lease ran out and the worker fell back to its
    start-up schedule. Renewing at version 1 would name a schedule the worker no longer runs (409 forever)."""
    clock, vlab, workers = lab(lab_profile, 1, concurrency=2)
    control = workers[0].control
    control.apply(SpeculationUpdate(k=4, version=1, lease_seconds=1, reason="earlier controller"))
    clock.advance(2)
    assert control.expire()
    ctl = lab_controller(workers, lab_profile, clock)
    await run_lab(vlab, ctl, until_s=4, tick_s=2)
    assert control.version == 2
    assert control.lease_expires_at is not None
    assert sample(ctl, "gearshift_controller_actuation_failures_total", worker="w0") == 0


async def test_published_worker_state_and_cost(lab_profile: Profile) -> None:
    clock, vlab, workers = lab(lab_profile, 1, concurrency=2)
    ctl = lab_controller(workers, lab_profile, clock)
    await run_lab(vlab, ctl, until_s=30, tick_s=2)
    state = (await ctl.store.worker_states())["w0"]
    assert state.k_applied == workers[0].control.k_for(1)
    assert state.k_desired == state.k_applied
    assert state.accepted_length > 2
    assert len(state.acceptance_per_pos) == 8
    assert state.acceptance_per_pos == sorted(state.acceptance_per_pos, reverse=True)  # unconditional a_i
    assert 1 + sum(state.acceptance_per_pos[: state.k_applied]) == pytest.approx(state.accepted_length, rel=0.1)
    assert state.tpot_predicted_s is not None
    assert state.usd_per_mtok is not None
    assert state.usd_per_mtok > 0
    assert state.reason
    assert not state.overloaded
    cost = ctl.workers["w0"].cost
    assert cost is not None
    assert 0 < cost.drafter_share < 1
    assert 0 < cost.rejected_share < 1
    assert cost.savings_usd > 0, "at two streams of maths speculation saves money"
    assert sample(ctl, "gearshift_controller_usd_per_mtok", worker="w0") == pytest.approx(state.usd_per_mtok)
    # the cost split goes to the store too (the console's fleet and costs pages read it there)
    assert state.drafter_share == pytest.approx(cost.drafter_share)
    assert cost.usd_per_mtok_k0 is not None
    assert state.usd_per_mtok_k0 == pytest.approx(cost.usd_per_mtok_k0)


async def test_worker_cost_is_split_over_tenants_from_the_ledger(lab_profile: Profile) -> None:
    clock, vlab, workers = lab(lab_profile, 1, concurrency=2)
    tenants = TenantsConfig(
        tiers={"t": TierConfig()}, tenants=(TenantConfig(id="a", tier="t"), TenantConfig(id="b", tier="t"))
    )
    settings = ControllerSettings(tenant_interval_s=1000.0)  # attributed on demand below
    ctl = lab_controller(workers, lab_profile, clock, settings=settings, tenants=tenants)
    start = clock.wall()
    for tenant, tokens in (("a", 101), ("b", 301)):
        await ctl.store.append_usage(
            UsageRecord(request_id=tenant, tenant=tenant, model="kimi-k3", worker_id="w0", prompt_tokens=0,
                        completion_tokens=tokens, cost_usd=0.0, status="ok", tpot_s=0.01, at=start + 5)
        )  # fmt: skip
    await run_lab(vlab, ctl, until_s=32, tick_s=2)
    shares = await ctl.attribute_tenants()
    a = sample(ctl, "gearshift_controller_tenant_cost_usd_total", tenant="a")
    b = sample(ctl, "gearshift_controller_tenant_cost_usd_total", tenant="b")
    assert a > 0
    assert b == pytest.approx(3 * a)
    worker_usd = 16 * 3.0 / 3600 * 30  # the default worker's $/s over the 30 s after the first scrape
    assert a + b == pytest.approx(worker_usd, rel=0.01)
    assert shares == pytest.approx({"a": a, "b": b})
    assert await ctl.attribute_tenants() == {}, "each record is attributed once"


async def test_tenant_cost_labels_are_the_gateways_hashes_under_metrics_tenant_label_hash(lab_profile: Profile) -> None:
    """Issue 23's security pass: the controller's per-tenant cost carries the same salted label as the gateway's
    metrics (``fleet.metric_labels``), so the cost dashboard's metered-vs-attributed join still lines up."""
    clock, vlab, workers = lab(lab_profile, 1, concurrency=2)
    tenants = TenantsConfig(tiers={"t": TierConfig()}, tenants=(TenantConfig(id="a", tier="t"),))
    settings = ControllerSettings(tenant_interval_s=1000.0, metrics_tenant_label="hash", key_pepper="pepper-x")
    ctl = lab_controller(workers, lab_profile, clock, settings=settings, tenants=tenants)
    await ctl.store.append_usage(
        UsageRecord(request_id="r", tenant="a", model="kimi-k3", worker_id="w0", prompt_tokens=0,
                    completion_tokens=50, cost_usd=0.0, status="ok", tpot_s=0.01, at=clock.wall() + 5)
    )  # fmt: skip
    await run_lab(vlab, ctl, until_s=32, tick_s=2)
    await ctl.attribute_tenants()
    gateway_label = GatewaySettings(key_pepper="pepper-x", metrics_tenant_label="hash").tenant_labeler()("a")
    assert sample(ctl, "gearshift_controller_tenant_cost_usd_total", tenant=gateway_label) > 0
    assert sample(ctl, "gearshift_controller_tenant_cost_usd_total", tenant="a") == 0.0
