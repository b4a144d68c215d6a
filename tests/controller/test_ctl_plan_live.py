"""Issue 25's live test: the fleet plan takes workers drafter-free on a real Redis, with four simulated workers, two
gateway replicas and the controller pair (a leader and a standby), each with its own connection to one
``redis-server``.

The workers run at 1× on the chaos bench's restart profile (``bench.chaos.restarts.restart_profile``): a 1.5 s
restart, a costly drafter (+10 ms a pass, +100 % on a k = 0 step with it loaded) and a workload (``noise``) whose
drafts are almost never accepted, so that on the interactive tier's 15 ms TPOT target every gear with the drafter
misses and drafter-free k = 0 meets it.
Under a light load through both gateways the planner (not an operator switch, not a per-worker stretch) plans
w1, w2 and w3 drafter-free (w0 is kept as started by the operator), and the drafter-free gear carries the moves out
one at a time:

1. w1 is drained and restarted drafter-free by the plan (the leader then stops; the standby takes the lease and
   carries on from the records in the store);
2. ``x-gearshift-speculation: off`` requests, through either gateway, land only on w1;
3. the header from a tenant whose policy does not allow that value gets a 400 that names it, from either gateway;
4. a failed restart returns the worker to service: w2's restart comes back with its drafter (the simulated
   worker's ``restart_falls_back`` fault, as the vLLM supervisor falls back), and w3's restart control vanishes
   once it has accepted the restart (a supervisor gone: the bench's ``VanishingSupervisor``); each serves again,
   in the mode it was last seen in, and the model's next planned move still runs (issue 23, defect 1).

No request of the load fails. Every wait is bounded in polls and seconds."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from bench.chaos.restarts import RESTART_S, TIGHT_TPOT_S, VanishingSupervisor, restart_profile
from controller.actuator import HttpActuator
from controller.app import build_gear_modes
from controller.loop import Controller
from controller.settings import ControllerSettings
from controller.sources import HttpScrapeSource
from fleet.clock import SystemClock
from fleet.config import FleetConfig, TenantsConfig, key_digest
from fleet.plan import FleetPlan, read_plans
from fleet.store.redis import RedisStore
from fleet.worker_mode import Mode, Phase, WorkerMode, read_modes
from gateway.routing.filters.eligibility import routable
from tests.gateway.harness import KEYS, PEPPER, RunningGateway, eventually, serve_gateway
from tests.sims import running
from workers.sim.server import SimServer
from workers.sim.settings import SimWorkerSettings

from .ctl_helpers import CONTROL_TOKEN as TOKEN

MODEL = "kimi-k3"
HEADER = "x-gearshift-speculation"
TPOT_TARGET_S = TIGHT_TPOT_S
BODY = {"model": MODEL, "prompt": "hello", "max_tokens": 16, "ignore_eos": True}
WORKERS = ("w0", "w1", "w2", "w3")


def plan_tenants() -> TenantsConfig:
    """One interactive tier; alpha may not send the speculation header, beta may send ``off`` (not ``fast``)."""
    allowed = {"alpha": [], "beta": ["off"]}
    return TenantsConfig.model_validate({
        "tiers": {"interactive": {"priority": 0, "tpot_target_s": TPOT_TARGET_S}},
        "tenants": [
            {"id": t, "tier": "interactive", "workload": "noise", "speculation_header": allowed[t],
             "keys": [{"id": f"{t}-1", "digest": key_digest(KEYS[t], pepper=PEPPER)}]}
            for t in allowed
        ],
    })  # fmt: skip


@contextlib.asynccontextmanager
async def plan_workers(profile: Path) -> AsyncIterator[dict[str, SimServer]]:
    """w0 … w3 at 1× on ``profile``, serving ``noise``; w2's restarts fall back to the mode they left."""
    servers = {
        w: SimServer(SimWorkerSettings(
            worker_id=w, port=0, seed=i, profile=str(profile), max_num_seqs=32, speedup=1.0, start_k=0,
            default_workload="noise", control_token=TOKEN, restart_falls_back=w == "w2",
        ))
        for i, w in enumerate(WORKERS)
    }  # fmt: skip
    async with running(list(servers.values())):
        yield servers


def controller_settings() -> ControllerSettings:
    return ControllerSettings(
        tick_s=0.2, schedule_lease_s=5.0, leader_lease_s=3.0, state_ttl_s=1.0, control_token=TOKEN, metrics_port=0,
        stabiliser={"min_dwell_s": 0.2, "probe_interval_s": 600.0, "probe_s": 0.4, "stale_hold_s": 0.5},
        placement={"period_s": 0.5, "class_window_s": 5.0, "forecast": False, "min_dwell_s": 600.0, "ttl_s": 5.0},
        drafter_free={"enabled": True, "min_dwell_s": 6.0, "drain_grace_s": 0.3, "restart_timeout_factor": 2.0},
    )  # fmt: skip


class ModeLog:
    """Every distinct record of each worker's mode, and the model's first plan, polled from the store until
    ``stop``."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.seen: dict[str, list[WorkerMode]] = {w: [] for w in WORKERS}
        self.first_plan: FleetPlan | None = None

    async def watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for wid, mode in (await read_modes(self.store)).items():
                log = self.seen.setdefault(wid, [])
                if not log or log[-1] != mode:
                    log.append(mode)
            if self.first_plan is None:
                self.first_plan = (await read_plans(self.store)).get(MODEL)
            await asyncio.sleep(0.02)

    def steps(self, wid: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for m in self.seen[wid]:
            if not out or out[-1] != (m.mode.value, m.phase.value):
                out.append((m.mode.value, m.phase.value))
        return out

    def first(self, wid: str, phase: Phase, words: str) -> WorkerMode | None:
        return next((m for m in self.seen[wid] if m.phase is phase and words in m.reason), None)


async def load(gateways: list[RunningGateway], stop: asyncio.Event, statuses: list[int]) -> None:
    """Two closed-loop clients of alpha per gateway, without the header, until ``stop``."""

    async def client(gw: RunningGateway) -> None:
        async with gw.client("alpha") as c:
            while not stop.is_set():
                statuses.append((await c.post("/v1/completions", json=BODY)).status_code)

    await asyncio.gather(*(client(g) for g in gateways for _ in range(2)))


async def post_all(gateways: list[RunningGateway], tenant: str, n: int, value: str) -> list[httpx.Response]:
    """``n`` concurrent completions of ``tenant`` with the header at ``value``, alternating between the gateways."""
    clients = [g.client(tenant) for g in gateways]
    try:
        return list(await asyncio.gather(*(
            clients[i % len(clients)].post("/v1/completions", json=BODY, headers={HEADER: value}) for i in range(n)
        )))  # fmt: skip
    finally:
        for c in clients:
            await c.aclose()


async def served_by(store: RedisStore, gateways: list[RunningGateway], since: float) -> dict[str, set[str]]:
    """Tenant → the workers its requests finished on since ``since`` (Unix s), every gateway's ledger flushed."""
    for g in gateways:
        await g.gw.ledger.idle()
    out: dict[str, set[str]] = {}
    for r in await store.ledger(since=since, until=time.time() + 1, limit=100_000):
        out.setdefault(r.tenant, set()).add(r.worker_id or "")
    return out


@pytest.mark.redis
@pytest.mark.slow
async def test_the_plan_moves_workers_drafter_free_and_a_failed_restart_returns_the_worker(
    redis_url: str, tmp_path: Path
) -> None:
    prefix = f"test:{uuid.uuid4().hex[:12]}:"
    stores = [RedisStore.from_url(redis_url, prefix=prefix) for _ in range(5)]
    reader, ctl_stores, gw_stores = stores[0], stores[1:3], stores[3:]
    clock = SystemClock()
    tenants = plan_tenants()
    settings = controller_settings()
    stops = {"a": asyncio.Event(), "b": asyncio.Event()}
    done = asyncio.Event()
    statuses: list[int] = []
    modes = ModeLog(reader)
    async with (
        plan_workers(restart_profile(tmp_path / "plan-live.yaml")) as sims,
        httpx.AsyncClient() as http,
        contextlib.AsyncExitStack() as stack,
    ):
        supervisor = await VanishingSupervisor(sims["w3"].url, armed=True).start()
        stack.push_async_callback(supervisor.stop)
        workers = [
            {"id": w, "url": s.url, "model": MODEL, "max_num_seqs": 32, "allow_drafter_free": w != "w0",
             **({"restart_url": supervisor.url} if w == "w3" else {})}
            for w, s in sims.items()
        ]  # fmt: skip
        fleet = FleetConfig.model_validate(
            {"models": [{"name": MODEL, "profile": str(tmp_path / "plan-live.yaml")}], "workers": workers}
        )
        controllers = {
            name: Controller(
                fleet=fleet, tenants=tenants, settings=settings, source=HttpScrapeSource(http, clock=clock),
                actuator=HttpActuator(http, control_token=TOKEN), store=store, clock=clock, holder_id=name,
                gear_modes=build_gear_modes(settings, fleet, store=store, client=http, clock=clock),
            )
            for name, store in zip(stops, ctl_stores, strict=True)
        }  # fmt: skip
        gateways = [
            await stack.enter_async_context(serve_gateway(fleet, tenants, store=s, clock=clock)) for s in gw_stores
        ]
        tasks = {"a": asyncio.create_task(controllers["a"].run(stops["a"]))}
        await eventually(lambda: controllers["a"].is_leader, timeout_s=5.0)
        tasks["b"] = asyncio.create_task(controllers["b"].run(stops["b"]))
        background = [asyncio.create_task(load(gateways, done, statuses)), asyncio.create_task(modes.watch(done))]
        try:
            # 1. w1 drained and restarted drafter-free by the plan, then read back by both gateways.
            async def w1_drafter_free_everywhere() -> bool:
                record = (await read_modes(reader)).get("w1")
                if record is None or (record.mode, record.phase) != (Mode.DRAFTER_FREE, Phase.SERVING):
                    return False
                views = [g.gw.pool.views["w1"] for g in gateways]
                return all(v.mode is not None and v.mode.mode is Mode.DRAFTER_FREE and routable(v, clock.wall())
                           for v in views)  # fmt: skip

            await eventually(w1_drafter_free_everywhere, timeout_s=40.0, every_s=0.05)
            plan = modes.first_plan
            assert plan is not None
            assert {w: p.drafter for p in plan.pools for w in p.workers} == {
                "w0": "loaded", "w1": "off", "w2": "off", "w3": "off"
            }, plan  # fmt: skip
            assert "restart w1, w2, w3" in plan.reason, plan.reason
            assert await reader.lease_holder(settings.leader_lease_name) == "a", "a leads, b stands by"
            assert not controllers["b"].is_leader
            # The leader goes; the standby takes over and carries on from the records.
            stops["a"].set()
            await tasks["a"]
            await eventually(lambda: controllers["b"].is_leader, timeout_s=3 * settings.leader_lease_s)

            # 2. off lands only on w1, through either gateway; 3. a header the tenant may not send: 400.
            off_since = clock.wall()
            off = await post_all(gateways, "beta", 12, "off")
            assert [r.status_code for r in off] == [200] * 12, [r.text for r in off if r.status_code != 200]
            assert (await served_by(reader, gateways, off_since))["beta"] == {"w1"}
            for tenant, value in (("alpha", "off"), ("alpha", "fast"), ("beta", "fast")):
                for refused in await post_all(gateways, tenant, 2, value):
                    assert refused.status_code == 400, refused.text
                    error = refused.json()["error"]
                    assert (error["param"], error["code"]) == (HEADER, "header_not_allowed"), error
                    assert HEADER in error["message"]

            # 4. w2's restart falls back, w3's restart control vanishes: each serves again, and takes requests.
            async def both_failed_and_served_again() -> bool:
                fell_back = modes.first("w2", Phase.RETURNING, "fell back")
                given_up = modes.first("w3", Phase.SERVING, "not back")
                if fell_back is None or given_up is None:
                    return False
                after = await asyncio.gather(*(served_by(reader, gateways, m.since) for m in (fell_back, given_up)))
                return "w2" in after[0].get("alpha", set()) and "w3" in after[1].get("alpha", set())

            await eventually(both_failed_and_served_again, timeout_s=40.0, every_s=0.2)
        finally:
            done.set()
            for stop in stops.values():
                stop.set()
            await asyncio.gather(*tasks.values(), *background)
    for s in stores:
        await s.close()

    assert [c for c in statuses if c != 200] == [], "the load never failed"
    assert len(statuses) > 0
    move = [("drafter", "serving"), ("drafter", "draining"), ("drafter", "restarting")]
    assert modes.steps("w1")[:5] == [*move, ("drafter-free", "returning"), ("drafter-free", "serving")]
    assert "the fleet plan wants it drafter-free" in modes.seen["w1"][1].reason
    assert modes.steps("w2")[:5] == [*move, ("drafter", "returning"), ("drafter", "serving")]
    assert modes.steps("w3")[:4] == [*move, ("drafter", "serving")]
    given_up = modes.first("w3", Phase.SERVING, "not back")
    assert given_up is not None
    restarting = next(m for m in modes.seen["w3"] if m.phase is Phase.RESTARTING)
    assert given_up.since - restarting.since <= (settings.drafter_free.restart_timeout_factor + 1.5) * RESTART_S
    fell_back = modes.first("w2", Phase.RETURNING, "fell back")
    assert fell_back is not None
    retries = [m for m in modes.seen["w2"] if m.phase is Phase.DRAINING and m.since > fell_back.since]
    dwell = settings.drafter_free.min_dwell_s
    assert all(m.since - fell_back.since >= dwell for m in retries), "a failed restart is not retried at once"
    assert modes.steps("w0") == [("drafter", "serving")], "kept as started by the operator"
    assert sims["w0"].worker.restarts == 0
    assert (sims["w1"].worker.restarts, sims["w1"].worker.drafter_loaded) == (1, False)
    assert sims["w2"].worker.restarts >= 1
    assert sims["w2"].worker.drafter_loaded, "w2's restarts fall back"
    assert sims["w3"].worker.restarts == 1, "w3 restarted once; its record could not learn how it came back"
