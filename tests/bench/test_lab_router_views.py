"""The lab's router keeps one ``WorkerView`` per worker across requests (as the gateway's pool does) instead of
building every view per request: at every request the views it routes on equal, field by field, the ones a fresh
build would give (in flight, outstanding prefill, published state, health, gear record)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from bench.policy import load
from bench.policy.controller_lab import lab_fleet
from bench.policy.lab import run_policy
from bench.policy.routing import GatewayRouter
from bench.policy.run_metrics import summarise
from bench.policy.scenario import load_scenarios
from bench.policy.suite import baseline_policies
from fleet.clock import ManualClock
from fleet.config import SpeculationMode, TierConfig
from fleet.perf import load_profile
from fleet.plan import FleetPlan, TrafficClass
from fleet.worker_mode import Mode, Phase, WorkerMode
from gateway.routing.context import RouteContext
from gateway.routing.pool import WorkerView
from gateway.routing.router import Decision
from workers.sim.arrivals import Lengths, RequestKind, RequestSpec, WorkloadMix, poisson
from workers.sim.virtual import TickContext, VirtualLab, VirtualWorker, make_worker

PROFILE = load_profile("kimi-k3-dspark-tp16")


def _fields(view: WorkerView) -> tuple[object, ...]:
    return tuple(getattr(view, f.name) for f in dataclasses.fields(view))


class _Checked(GatewayRouter):
    """Routes as the lab does and records, per request, the views routed on and a fresh build of them."""

    pairs: list[tuple[list[tuple[object, ...]], list[tuple[object, ...]]]]

    def _rank(
        self,
        workers: Sequence[VirtualWorker],
        spec: RequestSpec,
        tier: TierConfig,
        cls: TrafficClass | None = None,
        plan: FleetPlan | None = None,
        *,
        mode: SpeculationMode = SpeculationMode.AUTO,
    ) -> int:
        states, modes, now_s = self._states(), self._modes() if self._modes else {}, self._clock.monotonic()
        fresh = [
            WorkerView(
                config=self._views[w.worker_id].config,
                in_flight=w.outstanding,
                prefill_tokens=self._prefill_tokens(w),
                state=states.get(w.worker_id),
                healthy=w.offline_until_s <= now_s,
                mode=modes.get(w.worker_id),
            )
            for w in workers
        ]
        route = self._router.route
        seen: list[list[tuple[object, ...]]] = []

        async def spy(ctx: RouteContext, views: Sequence[WorkerView]) -> Decision:
            seen.append([_fields(v) for v in views])
            return await route(ctx, views)

        self._router.route = spy  # type: ignore[method-assign, assignment]
        try:
            index = super()._rank(workers, spec, tier, cls, plan, mode=mode)
        finally:
            del self._router.route
        self.pairs.append((seen[0], [_fields(v) for v in fresh]))
        return index


def test_the_views_routed_on_equal_a_fresh_build_at_every_request() -> None:
    clock = ManualClock()
    workers = [make_worker(PROFILE, f"w{i}", clock, k=4, max_num_seqs=8, seed=i) for i in range(3)]
    modes: dict[str, WorkerMode] = {}
    router = _Checked(
        fleet=lab_fleet(workers, PROFILE), tiers={"batch": TierConfig()}, clock=clock, states=dict, modes=lambda: modes
    )
    router.pairs = []

    def tick(ctx: TickContext) -> None:
        """Every few seconds w1 drains or comes back and w2 restarts for a while."""
        second = int(ctx.now_s)
        modes.clear()
        if second % 6 < 3:
            modes["w1"] = WorkerMode(worker_id="w1", mode=Mode.DRAFTER, phase=Phase.DRAINING, since=0, mode_since=0)
        if second % 10 == 0:
            workers[2].offline_until_s = ctx.now_s + 2.0

    mix = WorkloadMix((RequestKind("chat", Lengths(400, 0.5), Lengths(40, 0.5), tag="batch"),))
    lab = VirtualLab(workers, poisson(12.0, mix), clock=clock, seed=5, router=router, tick_s=1.0, on_tick=tick)
    try:
        lab.run(30.0)
    finally:
        router.close()
    assert len(router.pairs) > 200
    assert {len(p[0]) for p in router.pairs} == {3}
    assert any(any(row[6] != 0 for row in routed) for routed, _ in router.pairs), "prefill outstanding seen"
    assert any(not all(row[2] for row in routed) for routed, _ in router.pairs), "an unhealthy worker seen"
    for i, (routed, fresh) in enumerate(router.pairs):
        assert routed == fresh, f"request {i}"


# ------------------------------------------------------------------ issue 25: speculation off in the lab
def _off_lab(modes: dict[str, WorkerMode], *, rate: float = 20.0) -> tuple[GatewayRouter, list[str]]:
    """30 s of chat, one request in five from a tier whose ``speculation`` is ``off``, on three workers; the
    router's choices for the off tier's requests, by worker id."""
    clock = ManualClock()
    workers = [make_worker(PROFILE, f"w{i}", clock, k=4, max_num_seqs=8, seed=i) for i in range(3)]
    tiers = {"chat": TierConfig(), "no-spec": TierConfig(speculation=SpeculationMode.OFF)}
    fleet = lab_fleet(workers, PROFILE)
    router = GatewayRouter(fleet=fleet, tiers=tiers, clock=clock, states=dict, modes=lambda: modes)
    mix = WorkloadMix((
        RequestKind("chat", Lengths(400, 0.5), Lengths(40, 0.5), weight=4.0, tag="chat"),
        RequestKind("chat", Lengths(400, 0.5), Lengths(40, 0.5), weight=1.0, tag="no-spec"),
    ))  # fmt: skip
    lab = VirtualLab(workers, poisson(rate, mix), clock=clock, seed=9, router=router)
    try:
        lab.run(30.0)
    finally:
        router.close()
    return router, [r.worker_id for r in lab.records.requests if r.tag == "no-spec"]


def test_speculation_off_requests_go_only_to_a_worker_without_its_drafter() -> None:
    """The gateway's own rule (``SpeculationFilter``) in the lab: however loaded it is, the one drafter-free
    worker serves every ``off`` request, and none is refused."""
    free = WorkerMode(worker_id="w2", mode=Mode.DRAFTER_FREE, since=0, mode_since=0)
    router, off = _off_lab({"w2": free})
    assert len(off) > 50
    assert set(off) == {"w2"}
    assert router.refused == []


def test_an_off_request_no_worker_may_serve_is_recorded_as_refused() -> None:
    router, off = _off_lab({})
    assert len(router.refused) == len(off) > 50, "every one: the gateway answers 503"
    assert {tier for _, _, tier in router.refused} == {"no-spec"}


def test_the_off_traffic_scenario_counts_a_refused_request_as_a_miss() -> None:
    """The 20 %-off scenario (issue 25): with every worker drafting, each ``off`` request is one the gateway
    refuses, and misses its SLA; started without the drafter, the workers serve every one."""
    (raw,) = load_scenarios(Path(str(resources.files("bench.policy"))) / "plan_scenarios", ["plan-off-traffic"])
    bound = raw.on(PROFILE).scaled(0.02)
    sc = load.resolve(bound, {load.mix_key(bound, p): load.capacity_for(bound, p, PROFILE) for p in bound.phases})
    offs = {p.name: p for p in baseline_policies(PROFILE, sc)}
    drafting = run_policy(sc, offs["vllm-table"], profile=PROFILE)
    off_requests = [r for r in drafting.records.requests if r.tag == "no-spec"]
    assert len(drafting.refused) == len(off_requests) > 0
    assert summarise(drafting, PROFILE).sla_attainment["no-spec"] == 0.0
    free = run_policy(sc, offs["no-drafter"], profile=PROFILE)
    assert free.refused == ()
    assert summarise(free, PROFILE).sla_attainment["no-spec"] > 0.0
