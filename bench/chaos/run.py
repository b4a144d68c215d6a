"""``gearshift bench chaos``: start the stack once (``bench.chaos.stack``), warm it up and size each fault's budget
from a measured request cost, then for each fault run bounded load before, during and after it, and measure
(``bench.chaos.measure``) what the clients and the ledger saw. Every phase is bounded in time; the stack is torn
down whatever happens. Times are seconds."""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

from bench.chaos import measure
from bench.chaos.faults import NOT_INJECTED, Fault, FaultRun
from bench.chaos.load import DEFAULT_GROUPS, ClientGroup, Load, Sent, body
from bench.chaos.restarts import restart_shape
from bench.chaos.stack import LIMITS, ChaosStack, LimitSizes, StackShape, chaos_stack, tenant_id
from bench.soak.ledger import LedgerDiff, ledger_diff
from fleet.store.keys import spend_key
from fleet.store.protocol import UsageRecord
from gateway.settings import GatewaySettings
from gateway.upstream.body import BodyRules, parse_completion

WARMUP = "warmup"


@dataclass(frozen=True)
class ChaosConfig:
    faults: tuple[Fault, ...]
    before_s: float = 8.0
    after_s: float = 10.0
    warmup_s: float = 6.0
    speedup: float = 1.0
    """Simulated seconds per real second of the workers."""
    sizes: LimitSizes = field(default_factory=lambda: LimitSizes(budget_usd=1000.0))
    budget_requests: float = 0.6
    """Each fault's budget is sized to run out after this share of the requests its budget clients would send
    before the fault ends (from the warm-up's cost and rate per request)."""
    settle_s: float = 20.0
    """Longest wait for the ledger to hold every answered request after the load stops."""
    routable_wait_s: float = 15.0
    """Longest wait, after the load stops, for every gateway to route to every worker again."""
    groups: tuple[ClientGroup, ...] = DEFAULT_GROUPS
    during_scale: float = 1.0
    """Multiplies every fault's ``during_s`` (``--fast`` holds each fault for less)."""

    def during_s(self, fault: Fault) -> float:
        return fault.during_s * self.during_scale


@dataclass
class FaultResult:
    fault: Fault
    failures: measure.Failures
    ledger: LedgerDiff
    admissions: list[measure.Admission]
    recover_s: float | None
    unroutable: list[str]
    """``gateway: worker (why)`` still unroutable ``routable_wait_s`` after the load stopped."""
    routable_after_s: float | None
    notes: list[str]
    elapsed_s: float
    injected_s: float = 0.0
    """When the fault was injected, seconds from the start of its load."""
    healed_s: float = 0.0
    started_at: float = 0.0
    """``time.monotonic()`` at the start of its load (the clients' times are on this clock)."""
    sent: list[Sent] = field(repr=False, default_factory=list)


@dataclass
class ChaosResult:
    config: ChaosConfig
    results: list[FaultResult] = field(default_factory=list)
    elapsed_s: float = 0.0
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    cpus: int = 0
    request_cost_usd: float = 0.0
    not_injected: tuple[tuple[str, str], ...] = NOT_INJECTED


def prompt_estimate() -> int:
    """The gateway's estimate of the clients' prompt (``gateway.upstream.body``'s rule, default settings)."""
    rules = BodyRules.from_settings(GatewaySettings())
    return parse_completion(orjson.dumps(body(1)), prompt_field="messages", rules=rules).prompt_tokens


def budget_lease_s() -> float:
    """How long a budget lease's spend serves requests on the stack's gateways (default settings); 0 with leases
    off."""
    settings = GatewaySettings()
    return settings.lease_ttl_s if settings.lease_fraction > 0 else 0.0


async def _records(stack: ChaosStack, tenant: str) -> list[UsageRecord]:
    return list((await stack.store.usage(tenant, since=0, until=math.inf, limit=100_000)).records)


async def _fault_records(stack: ChaosStack, fault: str) -> dict[str, list[UsageRecord]]:
    return {role: await _records(stack, tenant_id(fault, role)) for role in ("free", *LIMITS)}


async def _settled(stack: ChaosStack, fault: str, sent: Sequence[Sent], wait_s: float) -> dict[str, list[UsageRecord]]:
    """The fault's records once the ledger holds every answered request (or ``wait_s`` has passed) and then one
    more read 1 s later finds nothing new (late spool replays)."""
    answered = sum(s.result.ok for s in sent)
    deadline = time.monotonic() + wait_s
    records = await _fault_records(stack, fault)
    while time.monotonic() < deadline:
        total = sum(len(v) for v in records.values())
        await asyncio.sleep(1.0)
        again = await _fault_records(stack, fault)
        if total >= answered and sum(len(v) for v in again.values()) == total:
            return again
        records = again
    return records


def _unroutable(view: dict[str, object], now: float) -> str | None:
    why = []
    if not view.get("healthy"):
        why.append("unhealthy")
    ejected = view.get("ejected_until")
    if isinstance(ejected, int | float) and ejected > now:
        why.append("ejected")
    mode = view.get("mode")
    if isinstance(mode, dict) and mode.get("phase") not in ("serving", "returning"):
        why.append(f"mode {mode.get('phase')}")
    return ", ".join(why) or None


async def unroutable_workers(stack: ChaosStack) -> list[str]:
    """``gateway-i: worker (why)`` for every worker some gateway would not route to now."""
    out: list[str] = []
    headers = {"authorization": f"Bearer {stack.secrets.admin_key}"}
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as s:
        for i, url in enumerate(stack.gateway_urls):
            try:
                async with s.get(url + "/admin/v1/workers") as resp:
                    data = orjson.loads(await resp.read())["data"]
            except (aiohttp.ClientError, OSError, TimeoutError, KeyError, orjson.JSONDecodeError) as exc:
                out.append(f"gateway-{i}: not answering ({type(exc).__name__})")
                continue
            now = time.time()
            out += [f"gateway-{i}: {v['id']} ({why})" for v in data if (why := _unroutable(v, now))]
    return out


async def _wait_routable(stack: ChaosStack, wait_s: float) -> tuple[float | None, list[str]]:
    t0 = time.monotonic()
    left = await unroutable_workers(stack)
    while left and time.monotonic() - t0 < wait_s:
        await asyncio.sleep(0.5)
        left = await unroutable_workers(stack)
    return (None if left else time.monotonic() - t0), left


def _group(cfg: ChaosConfig, role: str) -> ClientGroup:
    return next(g for g in cfg.groups if g.role == role)


def _admissions(
    cfg: ChaosConfig, fault: Fault, sent: Sequence[Sent], records: dict[str, list[UsageRecord]], spent: float,
    budget: float,
) -> list[measure.Admission]:  # fmt: skip
    refused = {role: any(s.role == role and s.result.status == 429 for s in sent) for role in LIMITS}
    lost = fault.store_lost
    sizes = cfg.sizes
    return [
        measure.rpm_admission(records["rpm"], sizes.rpm, refused=refused["rpm"], store_lost=lost),
        measure.tpm_admission(
            records["tpm"], sizes.tpm, prompt_estimate=prompt_estimate(), clients=_group(cfg, "tpm").clients,
            refused=refused["tpm"], store_lost=lost,
        ),
        measure.concurrency_admission(records["conc"], sizes.max_concurrency, refused=refused["conc"], store_lost=lost),
        measure.budget_admission(
            records["budget"], budget, spent, clients=_group(cfg, "budget").clients, refused=refused["budget"],
            store_lost=lost, gateway_of=measure.gateways_of(sent), lease_s=budget_lease_s(),
        ),
    ]  # fmt: skip


async def _set_budget(stack: ChaosStack, tenant: str, budget_usd: float) -> None:
    headers = {"authorization": f"Bearer {stack.secrets.admin_key}"}
    async with (
        aiohttp.ClientSession(headers=headers) as s,
        s.patch(f"{stack.gateway_urls[0]}/admin/v1/tenants/{tenant}", json={"budget_usd": budget_usd}) as resp,
    ):
        if resp.status != 200:
            raise RuntimeError(f"PATCH budget of {tenant}: {resp.status} {await resp.text()}")


async def _warm_up(stack: ChaosStack, cfg: ChaosConfig) -> tuple[float, float]:
    """Load the warm-up tenants for ``warmup_s``; (mean cost of a budget-sized request in USD, such requests per
    second per client)."""
    groups = (_group(cfg, "free"), _group(cfg, "budget"))
    load = Load(WARMUP, stack.secrets.keys, stack.gateway_urls, groups=groups, model=stack.model_of(WARMUP))
    stop = asyncio.Event()
    t0 = time.monotonic()
    await load.run(stop, deadline_s=t0 + cfg.warmup_s)
    elapsed = time.monotonic() - t0
    records = (await _settled(stack, WARMUP, load.sent, cfg.settle_s))["budget"]
    if not records:
        raise RuntimeError(f"warm-up: nothing billed ({[s.result.error_type for s in load.sent[:5]]})")
    cost = sum(r.cost_usd for r in records) / len(records)
    return cost, len(records) / (elapsed * groups[1].clients)


def _dump(path: Path, sent: Sequence[Sent], t0: float) -> None:
    """Every request of a fault, one JSON line each (seconds from the fault's start), for a post-mortem."""
    rows = [
        {
            "id": s.result.headers.get("x-request-id"), "role": s.role, "gateway": s.gateway,
            "started": round(s.result.started - t0, 4), "ended": round(s.result.ended - t0, 4),
            "status": s.result.status, "kind": s.result.error_type, "disconnected": s.disconnected,
            "completion_tokens": s.result.completion_tokens,
        }
        for s in sent
    ]  # fmt: skip
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


def _dump_records(path: Path, records: dict[str, list[UsageRecord]]) -> None:
    """The fault's ledger records, per tenant role, one JSON line each (Unix times), for a post-mortem."""
    rows = [{"role": role, **r.model_dump(mode="json", exclude_none=True)} for role, rs in records.items() for r in rs]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


async def run_fault(
    stack: ChaosStack, fault: Fault, cfg: ChaosConfig, budget: float, progress: Callable[[str], None]
) -> FaultResult:
    t0 = time.monotonic()
    load = Load(fault.name, stack.secrets.keys, stack.gateway_urls, groups=cfg.groups, model=stack.model_of(fault.name))
    run = FaultRun(stack=stack, load=load)
    stop = asyncio.Event()
    bound_s = cfg.before_s + cfg.during_s(fault) + cfg.after_s + 120.0  # a heal that hangs cannot hold the load forever
    traffic = asyncio.create_task(load.run(stop, deadline_s=t0 + bound_s))
    try:
        await asyncio.sleep(cfg.before_s)
        progress(f"{fault.name}: inject ({fault.what})")
        injected = time.monotonic()
        await fault.inject(run)
        await asyncio.sleep(max(0.0, cfg.during_s(fault) - (time.monotonic() - injected)))
        progress(f"{fault.name}: heal")
        healed = time.monotonic()
        await fault.heal(run)
        await asyncio.sleep(cfg.after_s)
    finally:
        stop.set()
        await traffic
    run.notes.insert(
        0, f"injected at {injected - t0:.1f} s, healed at {healed - t0:.1f} s of {time.monotonic() - t0:.1f} s"
    )
    progress(f"{fault.name}: {len(load.sent)} requests; checking the ledger and the workers")
    await asyncio.to_thread(_dump, stack.run_dir / f"{fault.name}.requests.jsonl", load.sent, t0)
    records = await _settled(stack, fault.name, load.sent, cfg.settle_s)
    await asyncio.to_thread(_dump_records, stack.run_dir / f"{fault.name}.records.jsonl", records)
    routable_s, left = await _wait_routable(stack, cfg.routable_wait_s)
    spent = await stack.store.spent(spend_key(tenant_id(fault.name, "budget")))
    all_records = [r for rs in records.values() for r in rs]
    return FaultResult(
        fault=fault,
        failures=measure.failures(load.sent, run.kills),
        ledger=ledger_diff([s.result for s in load.sent], all_records),
        admissions=_admissions(
            cfg,
            fault,
            load.sent,
            {k: measure.on_one_clock(v, load.sent, run.skews) for k, v in records.items()},
            spent,
            budget,
        ),
        recover_s=measure.time_to_recover(load.sent, healed, run.kills),
        unroutable=left,
        routable_after_s=routable_s,
        notes=run.notes,
        elapsed_s=time.monotonic() - t0,
        injected_s=injected - t0,
        healed_s=healed - t0,
        started_at=t0,
        sent=load.sent,
    )


async def run_chaos(
    cfg: ChaosConfig, run_dir: Path, *, progress: Callable[[str], None] = lambda _: None
) -> ChaosResult:
    """Each stack configuration the faults need (the main matrix's, then the restart faults'), one after the
    other, each started, warmed up and torn down on its own."""
    result = ChaosResult(config=cfg, cpus=os.cpu_count() or 0, load_before=os.getloadavg())
    t0 = time.monotonic()
    for name in dict.fromkeys(f.stack for f in cfg.faults):
        faults = [f for f in cfg.faults if f.stack == name]
        directory = run_dir if name == "main" else run_dir / name
        shape = None if name == "main" else restart_shape(directory / "config")
        speedup = cfg.speedup if name == "main" else 1.0  # the restart profile's times are wall seconds
        await _run_stack(cfg, faults, directory, shape, speedup, result, progress)
    result.elapsed_s = time.monotonic() - t0
    result.load_after = os.getloadavg()
    return result


async def _run_stack(
    cfg: ChaosConfig, faults: Sequence[Fault], run_dir: Path, shape: StackShape | None, speedup: float,
    result: ChaosResult, progress: Callable[[str], None],
) -> None:  # fmt: skip
    names = [f.name for f in faults] + [WARMUP]
    progress(f"starting the {'main' if shape is None else 'restarts'} stack (logs in {run_dir})")
    async with chaos_stack(run_dir, names, sizes=cfg.sizes, speedup=speedup, shape=shape) as stack:
        progress("warming up")
        cost, rate = await _warm_up(stack, cfg)
        result.request_cost_usd = cost
        budgets: dict[str, float] = {}
        for fault in faults:
            clients = _group(cfg, "budget").clients
            expected = rate * clients * (cfg.before_s + cfg.during_s(fault) + cfg.after_s)
            budgets[fault.name] = cost * max(2.0, cfg.budget_requests * expected)
            await _set_budget(stack, tenant_id(fault.name, "budget"), budgets[fault.name])
        await asyncio.sleep(1.5)  # every replica re-reads the run-time tenant changes (tenants_refresh_s)
        for fault in faults:
            result.results.append(await run_fault(stack, fault, cfg, budgets[fault.name], progress))
            r = result.results[-1]
            progress(
                f"{fault.name}: {r.failures.ok}/{r.failures.requests} ok, {r.failures.failed} failed "
                f"({r.failures.unclean} unclean), ledger differences {r.ledger.differences}, "
                f"recover {r.recover_s if r.recover_s is None else round(r.recover_s, 1)} s, unroutable {r.unroutable}"
            )
