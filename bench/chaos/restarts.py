"""The restart faults (issue 23): the supervisor's restart fails, and the supervisor is unreachable. They need a
stack of their own (``bench.chaos.stack``'s ``restarts`` configuration), where the fleet plan actually restarts a
worker within a run, and where the main matrix's faults do not run:

- the workers run a K3 profile changed for it (``restart_profile``): a 1.5 s restart, a costly drafter (+10 ms a
  pass, +100 % on a k = 0 step with it loaded) and a workload, ``noise``, whose drafts are almost never accepted,
  at 1× (so the ledger's rates are the profile's);
- two models of two workers each: ``kimi-k3`` (w0, kept as started by the operator, and w1, whose restarts come
  back in the mode they left: ``GEARSHIFT_SIM_RESTART_FALLS_BACK``, as the vLLM supervisor falls back) and
  ``kimi-k3-b`` (w2 kept, and w3, whose restart control is a ``VanishingSupervisor``); one fault per model, so
  neither fault's move waits for the other's;
- the controllers run the drafter-free gear (a minimum dwell of 20 s, given up after 2 restart times) and plan every
  second on a 5 s ledger window, without a forecast;
- every tenant is on the ``standard`` tier (a 50 ms TPOT target, which every gear meets: the plan keeps the
  drafters). A fault is injected by moving its tenants to the ``tight`` tier (15 ms, which only drafter-free k = 0
  meets) through the admin API: the plan then restarts the model's movable worker drafter-free, and the armed fault
  makes that restart fail. It is healed once the worker serves again (and the vanished supervisor is back), by
  moving the tenants back.

The other faults' bench runs on the main stack with the drafter-free gear off (its default)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import yaml
from aiohttp import web

from bench.chaos.faults import Fault, FaultRun
from bench.chaos.stack import LIMITS, ChaosStack, StackShape, TenantShape, tenant_id
from fleet.perf import load_profile
from fleet.restart import RESTART_PATH
from fleet.worker_mode import Phase, WorkerMode, read_modes

RESTART_S = 1.5
"""The restart profile's restart, seconds."""
WORKLOAD = "noise"
RELAXED_TPOT_S = 0.05
"""The ``standard`` tier's TPOT target: met with the drafter and without it."""
TIGHT_TPOT_S = 0.015
"""The ``tight`` tier's TPOT target: met only drafter-free (k = 0 with the drafter loaded takes ~19 ms)."""
MODELS = {"restart-fails": "kimi-k3", "supervisor-unreachable": "kimi-k3-b"}
"""Each restart fault's model (the warm-up uses the first)."""
MOVED = {"restart-fails": "w1", "supervisor-unreachable": "w3"}
"""The worker each fault's plan restarts (the other worker of its model is kept by the operator)."""
CONTROLLER_ENV = {
    "GEARSHIFT_DRAFTER_FREE__ENABLED": "true",
    "GEARSHIFT_DRAFTER_FREE__MIN_DWELL_S": "20",
    "GEARSHIFT_DRAFTER_FREE__DWELL_FACTOR": "1000",
    "GEARSHIFT_DRAFTER_FREE__DRAIN_GRACE_S": "1.5",
    "GEARSHIFT_DRAFTER_FREE__RESTART_TIMEOUT_FACTOR": "2",
    "GEARSHIFT_PLACEMENT__PERIOD_S": "1",
    "GEARSHIFT_PLACEMENT__CLASS_WINDOW_S": "5",
    "GEARSHIFT_PLACEMENT__FORECAST": "false",
    "GEARSHIFT_PLACEMENT__MIN_DWELL_S": "0",
}
"""The drafter-free gear on; moves only by the plan (a per-worker stretch of 1000 restart times never completes);
a failed restart's worker not moved again for 20 s (longer than a fault's window after it)."""
WAIT_S = 90.0
"""Longest wait for the plan's restart to start, or for the worker to serve again."""


def restart_profile_dict() -> dict[str, Any]:
    """The K3 profile with a short restart, a costly drafter and the ``noise`` workload (module docstring)."""
    profile = load_profile("kimi-k3-dspark-tp16").model_dump(mode="json")
    profile["name"] = "chaos-restarts"
    profile["figures"] = None
    profile["serving"]["restart_s"] = RESTART_S
    profile["drafter"]["fixed_s"] = 0.01
    profile["drafter"]["k0_tax"] = {"at_batch_1": 1.0, "at_high_batch": 1.0, "high_batch": 32}
    profile["acceptance"][WORKLOAD] = {"base": [0.02] * 7, "context_gain": 0.0}
    return profile


def restart_profile(path: Path) -> Path:
    """``restart_profile_dict`` written to ``path`` (YAML)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(restart_profile_dict()))
    return path


def restart_shape(config_dir: Path) -> StackShape:
    """The restarts stack (module docstring); its profile is written under ``config_dir``."""
    profile = str(restart_profile(config_dir / "restart-profile.yaml"))
    models = list(dict.fromkeys(MODELS.values()))
    workers = [
        {"id": f"w{i}", "url": "", "model": models[i // 2], "max_num_seqs": 32, "allow_drafter_free": i % 2 == 1}
        for i in range(4)
    ]
    return StackShape(
        fleet={"models": [{"name": m, "profile": profile} for m in models], "workers": workers},
        tenants=TenantShape(
            tiers={"standard": {"priority": 0, "tpot_target_s": RELAXED_TPOT_S},
                   "tight": {"priority": 0, "tpot_target_s": TIGHT_TPOT_S}},
            workload=WORKLOAD,
            models={"warmup": models[0], **MODELS},
        ),
        sim_extra=("--profile", profile, "--default-workload", WORKLOAD, "--start-k", "0", "--max-num-seqs", "32"),
        sim_env={1: {"GEARSHIFT_SIM_RESTART_FALLS_BACK": "true"}},
        sim_models={i: models[i // 2] for i in range(4)},
        controller_env=CONTROLLER_ENV,
        supervised=True,
    )  # fmt: skip


class VanishingSupervisor:
    """A worker's restart control: passes ``RESTART_PATH`` through to the worker; once ``armed``, the first restart
    it passes on is its last answer (it stops listening: connections refused), as a supervisor that died after
    taking the restart. ``start`` again listens on the same port."""

    def __init__(self, worker_url: str, *, armed: bool = False) -> None:
        self.worker_url = worker_url
        self.armed = armed
        self.gone_at: float | None = None
        """``time.monotonic()`` when it stopped listening (None: listening)."""
        self.url = ""
        self._port = 0
        self._http: httpx.AsyncClient | None = None
        self._runner: web.AppRunner | None = None
        self._gone: asyncio.Task[None] | None = None

    async def _pass(self, request: web.Request) -> web.Response:
        assert self._http is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        resp = await self._http.request(
            request.method, self.worker_url + RESTART_PATH, content=await request.read(), headers=headers
        )
        if request.method == "POST" and resp.status_code == 202 and self.armed and self._gone is None:
            self._gone = asyncio.create_task(self._vanish())  # once this answer is written
        return web.Response(status=resp.status_code, body=resp.content, content_type="application/json")

    async def _vanish(self) -> None:
        self.armed = False
        self.gone_at = time.monotonic()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def start(self) -> VanishingSupervisor:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=5.0)
        if self._gone is not None:
            await self._gone
            self._gone = None
        app = web.Application()
        app.router.add_route("*", RESTART_PATH, self._pass)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self._port, reuse_address=True).start()
        self._port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{self._port}"
        self.gone_at = None
        return self

    async def stop(self) -> None:
        if self._gone is not None:
            await self._gone
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None


async def set_tier(stack: ChaosStack, fault: str, tier: str) -> None:
    """Every tenant of ``fault`` on ``tier`` (admin API, first gateway); the replicas and the controllers re-read
    run-time tenants within a second or two."""
    headers = {"authorization": f"Bearer {stack.secrets.admin_key}"}
    async with aiohttp.ClientSession(headers=headers) as s:
        for role in ("free", *LIMITS):
            url = f"{stack.gateway_urls[0]}/admin/v1/tenants/{tenant_id(fault, role)}"
            async with s.patch(url, json={"tier": tier}) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"PATCH tier of {tenant_id(fault, role)}: {resp.status} {await resp.text()}")


async def _mode_until(
    stack: ChaosStack, worker: str, check: Callable[[WorkerMode], bool], timeout_s: float
) -> tuple[WorkerMode | None, float]:
    """``worker``'s mode record once ``check`` holds (None after ``timeout_s``), and the seconds it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        mode = (await read_modes(stack.store)).get(worker)
        if mode is not None and check(mode):
            return mode, time.monotonic() - t0
        await asyncio.sleep(0.1)
    return None, time.monotonic() - t0


async def _planned_restart(run: FaultRun, fault: str) -> None:
    """Move the fault's tenants to the tight tier and wait for the plan's restart of its worker."""
    worker = MOVED[fault]
    await set_tier(run.stack, fault, "tight")
    mode, took = await _mode_until(run.stack, worker, lambda m: m.phase is Phase.RESTARTING, WAIT_S)
    if mode is None:
        run.notes.append(f"tenants moved to the tight tier; {worker} not restarted within {took:.0f} s")
        return
    run.notes.append(f"tenants moved to the tight tier; the plan restarted {worker} {took:.1f} s later ({mode.reason})")


async def _back_in_service(run: FaultRun, fault: str, words: str) -> None:
    worker = MOVED[fault]
    mode, took = await _mode_until(
        run.stack, worker, lambda m: m.phase in (Phase.SERVING, Phase.RETURNING) and words in m.reason, WAIT_S
    )
    if mode is None:
        run.notes.append(f"{worker} not back in service within {took:.0f} s")
    else:
        run.notes.append(f"{worker} back in service {took:.1f} s after the heal began: {mode.reason}")
    await set_tier(run.stack, fault, "standard")


async def _inject_fallback(run: FaultRun) -> None:
    await _planned_restart(run, "restart-fails")


async def _heal_fallback(run: FaultRun) -> None:
    await _back_in_service(run, "restart-fails", "fell back")


async def _inject_vanish(run: FaultRun) -> None:
    supervisor = run.stack.supervisor
    assert supervisor is not None, "the restart faults run on the restarts stack"
    supervisor.armed = True
    await _planned_restart(run, "supervisor-unreachable")


async def _heal_vanish(run: FaultRun) -> None:
    supervisor = run.stack.supervisor
    assert supervisor is not None
    await _back_in_service(run, "supervisor-unreachable", "not back")
    if supervisor.gone_at is None:
        run.notes.append("the supervisor never went away")
        return
    away = time.monotonic() - supervisor.gone_at
    await supervisor.start()
    run.notes.append(f"the supervisor listens again after {away:.1f} s away")


RESTART_FAULTS: tuple[Fault, ...] = (
    Fault("restart-fails", "the plan restarts w1 drafter-free and its restart comes back with the drafter", 4.0,
          _inject_fallback, _heal_fallback, stack="restarts"),
    Fault("supervisor-unreachable", "the plan restarts w3 drafter-free and its supervisor vanishes once it has "
          "accepted the restart", 4.0, _inject_vanish, _heal_vanish, stack="restarts"),
)  # fmt: skip
