"""The chaos bench's deployment, all real processes on loopback: a 3 + 3 Redis Cluster, four simulated workers
(``w3`` behind a ``ChaosProxy`` served in the bench's own event loop, so it can turn slow or answer garbage), two
``gearshift gateway`` replicas (each with its own spool) and two ``gearshift controller`` processes (one leads).

Each fault gets tenants of its own (``fault_tenants``): one without limits carrying the general load, and one per
limit (RPM, TPM, concurrency, budget), so a fault's over-admission is measured on limits that no other fault used.
Processes that a fault kills are started again on the same port and with the same arguments (``restart``)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

import yaml

from bench.chaos.proxy import ChaosProxy
from bench.procs import (
    Proc,
    ProcessFailed,
    RedisCluster,
    free_port,
    gearshift_argv,
    redis_cluster_ok,
    spawn,
    start_controller,
    start_gateway,
    start_redis_cluster,
    start_sim,
    wait_http_ready,
    wait_until,
)
from fleet.config import key_digest
from fleet.store.redis import RedisStore

if TYPE_CHECKING:
    from bench.chaos.restarts import VanishingSupervisor

MODEL = "kimi-k3"
LIMITS = ("rpm", "tpm", "conc", "budget")
"""The limited tenants of every fault, by the limit each carries."""


@dataclass(frozen=True, slots=True)
class LimitSizes:
    """The limits of each fault's limited tenants (a tenant carries one of them)."""

    rpm: int = 60
    tpm: int = 6_000
    max_concurrency: int = 2
    budget_usd: float = 1.0
    """Replaced per fault once a warm-up has measured a request's cost (``ChaosStack.set_budget``)."""


def tenant_id(fault: str, role: str) -> str:
    """The tenant of ``fault`` in ``role``: ``free`` (no limits) or one of ``LIMITS``."""
    return f"{fault}.{role}"


@dataclass
class Secrets:
    pepper: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    admin_key: str = field(default_factory=lambda: "gs-admin-" + secrets.token_urlsafe(24))
    keys: dict[str, str] = field(default_factory=dict)
    """Tenant id → its API key secret (generated per run, never written to disk)."""


@dataclass(frozen=True, slots=True)
class TenantShape:
    """What every tenant of a stack shares but its limits: the tiers, its workload, and each fault's model."""

    tiers: Mapping[str, Mapping[str, object]] = field(default_factory=lambda: {"standard": {"priority": 0}})
    """Every tenant starts on ``standard``."""
    workload: str | None = None
    models: Mapping[str, str] = field(default_factory=dict)
    """Fault (or ``warmup``) → the model its tenants use (``MODEL`` when absent)."""


def tenants_document(
    faults: Sequence[str], sizes: LimitSizes, sec: Secrets, shape: TenantShape | None = None
) -> dict[str, object]:
    """Per fault: a ``free`` tenant and one tenant per limit; fills ``sec.keys``. A ``warmup`` tenant too."""
    shape = shape or TenantShape()
    limit_fields: dict[str, dict[str, float]] = {
        "free": {},
        "rpm": {"rpm": sizes.rpm},
        "tpm": {"tpm": sizes.tpm},
        "conc": {"max_concurrency": sizes.max_concurrency},
        "budget": {"budget_usd": sizes.budget_usd},
    }
    out: list[dict[str, object]] = []
    for fault, tid, fields in [("warmup", "warmup", {})] + [
        (f, tenant_id(f, role), limits) for f in faults for role, limits in limit_fields.items()
    ]:
        sec.keys[tid] = "gs-chaos-" + secrets.token_urlsafe(24)
        digest = key_digest(sec.keys[tid], pepper=sec.pepper)
        model = shape.models.get(fault, MODEL)
        workload = {"workload": shape.workload} if shape.workload else {}
        out.append({
            "id": tid, "tier": "standard", "models": [model], **workload, **fields,
            "keys": [{"id": tid, "digest": digest}],
        })  # fmt: skip
    return {"tiers": {k: dict(v) for k, v in shape.tiers.items()}, "tenants": out}


def fleet_document(urls: Sequence[str]) -> dict[str, object]:
    return {
        "models": [{"name": MODEL}],
        "workers": [{"id": f"w{i}", "url": u, "model": MODEL} for i, u in enumerate(urls)],
    }


SKEW_LAUNCH = (
    "import sys, time\n"
    "_real, _skew = time.time, float(sys.argv[1])\n"
    "time.time = lambda: _real() + _skew\n"
    "sys.argv = ['gearshift', 'gateway']\n"
    "from gearshift.cli.app import main\n"
    "main()\n"
)
"""A ``gearshift gateway`` whose wall clock (``time.time``, what ``fleet.clock`` reads) runs ``argv[1]`` seconds
off; monotonic time is untouched. No libfaketime here: the skew is applied inside the Python process."""


@dataclass
class ChaosStack:
    run_dir: Path
    cluster: RedisCluster
    sims: list[Proc]
    proxy: ChaosProxy
    """In front of ``sims[-1]`` (the fleet's last worker)."""
    gateways: list[Proc]
    controllers: list[Proc]
    env: dict[str, str]
    """Every gearshift process's ``GEARSHIFT_*`` settings (a gateway adds its port and spool)."""
    secrets: Secrets
    store: RedisStore
    """The bench's own client of the cluster under the run's prefix (ledger, spend, lease holder)."""
    worker_ids: list[str]
    supervisor: VanishingSupervisor | None = None
    """On the restarts stack: ``sims[-1]``'s restart control (``bench.chaos.restarts``)."""
    controller_env: dict[str, str] = field(default_factory=dict)
    """Added to ``env`` for the controllers only."""
    models: dict[str, str] = field(default_factory=dict)
    """Fault (or ``warmup``) → the model its load asks for (``MODEL`` when absent)."""

    def model_of(self, fault: str) -> str:
        return self.models.get(fault, MODEL)

    retired: list[Proc] = field(default_factory=list)
    """Processes replaced by ``restart`` (stopped at the end too)."""

    @property
    def gateway_urls(self) -> list[str]:
        return [g.url for g in self.gateways]

    def gateway_env(self, index: int, port: int) -> dict[str, str]:
        spool = self.run_dir / f"spool-{index}"
        return {**self.env, "GEARSHIFT_PORT": str(port), "GEARSHIFT_SPOOL_DIR": str(spool)}

    def restart_gateway(self, index: int, *, skew_s: float = 0.0) -> Proc:
        """Start gateway ``index`` again on its port and spool (its clock ``skew_s`` seconds off when non-zero);
        the old process must be gone."""
        old = self.gateways[index]
        old.stop()
        self.retired.append(old)
        argv = [sys.executable, "-c", SKEW_LAUNCH, repr(skew_s)] if skew_s else gearshift_argv("gateway")
        name = f"gateway-{index}-{len(self.retired)}"
        proc = spawn(name, argv, log_dir=self.run_dir, env=self.gateway_env(index, old.port))
        proc.port, proc.url = old.port, old.url
        wait_http_ready(proc, proc.url + "/healthz", timeout_s=60.0)
        self.gateways[index] = proc
        return proc

    def restart_sim(self, index: int) -> Proc:
        """Start simulated worker ``index`` again with its arguments (so on its port)."""
        old = self.sims[index]
        old.stop()
        self.retired.append(old)
        proc = spawn(f"{old.name}-{len(self.retired)}", old.argv, log_dir=self.run_dir)
        proc.port, proc.url = old.port, old.url
        wait_http_ready(proc, proc.url + "/health", timeout_s=60.0)
        self.sims[index] = proc
        return proc

    def restart_redis_node(self, index: int) -> Proc:
        """Start cluster node ``index`` again on its port and folder (it rejoins, as a replica if it was failed
        over), and wait until it reports ``cluster_state:ok``."""
        old = self.cluster.nodes[index]
        old.stop()
        self.retired.append(old)
        proc = spawn(f"{old.name}-{len(self.retired)}", old.argv, log_dir=self.run_dir)
        proc.port, proc.url = old.port, old.url
        self.cluster.nodes[index] = proc
        if not wait_until(lambda: redis_cluster_ok(proc.port), timeout_s=60.0, alive=proc.alive):
            raise ProcessFailed(f"{proc.name}: no cluster_state:ok after its restart:\n{proc.log_tail()}")
        return proc

    def start_controller(self, name: str) -> Proc:
        port = free_port()
        env = {**self.env, **self.controller_env, "GEARSHIFT_HOLDER_ID": name, "GEARSHIFT_METRICS_PORT": str(port)}
        proc = start_controller(name, env=env, log_dir=self.run_dir)
        proc.port, proc.url = port, f"http://127.0.0.1:{port}"
        self.controllers.append(proc)
        return proc

    def processes(self) -> list[Proc]:
        return [*self.controllers, *self.gateways, *self.sims, *self.cluster.nodes, *self.retired]


CONTROLLER_TIMING: Mapping[str, str] = {
    "GEARSHIFT_TICK_S": "0.5",
    "GEARSHIFT_LEADER_LEASE_S": "2",
    "GEARSHIFT_SCHEDULE_LEASE_S": "15",
    "GEARSHIFT_STATE_TTL_S": "10",
    "GEARSHIFT_MAX_BACKOFF_S": "1",
}
"""A leader lease of 2 s so a standby takes over within seconds of the leader's death."""

GATEWAY_TIMING: Mapping[str, str] = {
    "GEARSHIFT_CONNECT_TIMEOUT_S": "1",
    "GEARSHIFT_FIRST_BYTE_TIMEOUT_S": "10",
    "GEARSHIFT_IDLE_TIMEOUT_S": "5",
    "GEARSHIFT_HEALTH_INTERVAL_S": "1",
    "GEARSHIFT_HEALTH_TIMEOUT_S": "0.5",
    "GEARSHIFT_EJECT_FOR_S": "5",
    "GEARSHIFT_GATEWAY_REPLICAS": "2",
}
"""Short enough that a dead or hung worker is noticed within a second or two, and an ejected one returns in 5 s."""


def _start_cluster(log_dir: Path, attempts: int = 3) -> RedisCluster:
    """``start_redis_cluster``, again in a fresh folder when a node lost its port (or bus port) to another
    process between the pick and the bind."""
    for attempt in range(attempts):
        try:
            return start_redis_cluster(log_dir=log_dir / f"try-{attempt}")
        except ProcessFailed as exc:
            if "already in use" not in str(exc) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _write_config(directory: Path, fleet: dict[str, object], tenants: dict[str, object]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    (directory / "tenants.yaml").write_text(yaml.safe_dump(tenants))


@dataclass(frozen=True)
class StackShape:
    """How a stack's workers, fleet, tenants and controllers differ from the main matrix's (``chaos_stack``)."""

    fleet: dict[str, object]
    """The fleet file (its worker URLs are filled in at start: ``{url}`` of each worker's ``url``)."""
    tenants: TenantShape
    sim_extra: tuple[str, ...] = ()
    """``gearshift sim serve`` options of every worker."""
    sim_env: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    """Worker index → environment added to its process."""
    sim_models: Mapping[int, str] = field(default_factory=dict)
    """Worker index → the model it serves (``MODEL`` when absent)."""
    controller_env: Mapping[str, str] = field(default_factory=dict)
    supervised: bool = False
    """The last worker's restart control is a ``VanishingSupervisor`` (its fleet entry's ``restart_url``)."""


def main_shape() -> StackShape:
    return StackShape(fleet=fleet_document(["" for _ in range(4)]), tenants=TenantShape())


def _fleet_with(shape: StackShape, urls: Sequence[str], restart_url: str | None) -> dict[str, object]:
    workers = [dict(w) for w in cast(list[dict[str, object]], shape.fleet["workers"])]
    for w, url in zip(workers, urls, strict=True):
        w["url"] = url
    if restart_url is not None:
        workers[-1]["restart_url"] = restart_url
    return {**shape.fleet, "workers": workers}


@contextlib.asynccontextmanager
async def chaos_stack(
    run_dir: Path, faults: Sequence[str], *, sizes: LimitSizes, speedup: float, shape: StackShape | None = None
) -> AsyncIterator[ChaosStack]:
    """Start everything (see the module docstring; ``shape``: the main matrix's by default); stop every process,
    including restarted ones, at the end."""
    shape = shape or main_shape()
    cluster = await asyncio.to_thread(_start_cluster, run_dir / "cluster")
    sims: list[Proc] = []
    proxy: ChaosProxy | None = None
    supervisor: VanishingSupervisor | None = None
    stack: ChaosStack | None = None
    try:
        for i in range(4):
            sims.append(await asyncio.to_thread(
                start_sim, f"w{i}", log_dir=run_dir, speedup=speedup, seed=i, extra=shape.sim_extra,
                env=shape.sim_env.get(i), model=shape.sim_models.get(i, MODEL),
            ))  # fmt: skip
        proxy = await ChaosProxy(sims[-1].url).start()
        if shape.supervised:
            from bench.chaos.restarts import VanishingSupervisor  # it builds on this module

            supervisor = await VanishingSupervisor(sims[-1].url).start()
        sec = Secrets()
        config = run_dir / "config"
        urls = [s.url for s in sims[:-1]] + [proxy.url]
        fleet = _fleet_with(shape, urls, supervisor.url if supervisor is not None else None)
        tenants = tenants_document(faults, sizes, sec, shape.tenants)
        await asyncio.to_thread(_write_config, config, fleet, tenants)
        prefix = f"chaos-{uuid.uuid4().hex[:8]}:"
        env = {
            "GEARSHIFT_FLEET_FILE": str(config / "fleet.yaml"),
            "GEARSHIFT_TENANTS_FILE": str(config / "tenants.yaml"),
            "GEARSHIFT_REDIS_URL": cluster.url,
            "GEARSHIFT_REDIS_CLUSTER": "true",
            "GEARSHIFT_KEY_PREFIX": prefix,
            "GEARSHIFT_KEY_PEPPER": sec.pepper,
            "GEARSHIFT_ADMIN_KEY": sec.admin_key,
            "GEARSHIFT_ALLOW_DEV_SECRETS": "1",  # the simulated workers' development control token, on loopback
            "GEARSHIFT_HOST": "127.0.0.1",
            "GEARSHIFT_LOG_LEVEL": "WARNING",
            **GATEWAY_TIMING,
            **CONTROLLER_TIMING,
        }
        store = RedisStore.from_url(cluster.url, prefix=prefix, cluster=True)
        stack = ChaosStack(
            run_dir=run_dir, cluster=cluster, sims=sims, proxy=proxy, gateways=[], controllers=[], env=env,
            secrets=sec, store=store, worker_ids=[f"w{i}" for i in range(len(urls))], supervisor=supervisor,
        )  # fmt: skip
        for i in range(2):
            port = free_port()
            env_i = stack.gateway_env(i, port)
            gw = await asyncio.to_thread(start_gateway, f"gateway-{i}", env=env_i, log_dir=run_dir, timeout_s=60.0)
            stack.gateways.append(gw)
        stack.controller_env = dict(shape.controller_env)
        stack.models = dict(shape.tenants.models)
        for name in ("ctl-a", "ctl-b"):
            await asyncio.to_thread(stack.start_controller, name)
        yield stack
    finally:
        if stack is not None:
            await stack.store.close()
            for proc in stack.processes():
                proc.stop()
        for proc in sims:
            proc.stop()
        if supervisor is not None:
            await supervisor.stop()
        if proxy is not None:
            await proxy.stop()
        cluster.stop()
