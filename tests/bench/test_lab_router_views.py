"""The lab's router keeps one ``WorkerView`` per worker across requests (as the gateway's pool does) instead of
building every view per request: at every request the views it routes on equal, field by field, the ones a fresh
build would give (in flight, outstanding prefill, published state, health, gear record)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from bench.policy.controller_lab import lab_fleet
from bench.policy.routing import GatewayRouter
from fleet.clock import ManualClock
from fleet.config import TierConfig
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
            index = super()._rank(workers, spec, tier, cls, plan)
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
