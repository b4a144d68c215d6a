"""The gateway's resources, built once in the app's lifespan and closed there."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SpanExporter
from prometheus_client import CollectorRegistry

from fleet.clock import Clock
from fleet.config import FleetConfig, TenantsConfig
from fleet.store.protocol import Store
from gateway.intake.admin_guard import AdminGuard
from gateway.intake.admission import Admitter
from gateway.intake.auth import KeyRing
from gateway.intake.overload import OverloadGate
from gateway.intake.replicas import ReplicaRegistry
from gateway.intake.tenant_book import TenantBook
from gateway.routing.pool import WorkerPool
from gateway.routing.prefix import PrefixIndex
from gateway.routing.router import Router, default_router
from gateway.settings import GatewaySettings
from gateway.upstream.body import BodyRules
from gateway.upstream.client import Upstream, new_session
from gateway.usage.metering import LedgerWriter
from gateway.usage.metrics import SAMPLE_S, GatewayMetrics
from gateway.usage.tracing import build_tracing


@dataclass(frozen=True)
class GatewayDeps:
    """What one gateway is built from: its settings and the resources its caller owns (the store is opened and
    closed by the caller). Built once, by ``from_settings`` or field by field in tests, and passed whole to
    ``create_app``, ``GatewayServer`` and ``running_gateway``."""

    settings: GatewaySettings
    store: Store
    clock: Clock
    fleet: FleetConfig
    tenants: TenantsConfig
    upstream_session: aiohttp.ClientSession | None = None
    """None: a pooled session built from the settings and closed with the gateway."""
    registry: CollectorRegistry | None = None
    """Where the gateway's metrics are registered; None: the process's default registry."""
    span_exporter: SpanExporter | None = None
    """None: the exporter the settings name (``gateway.usage.tracing``)."""
    rng: random.Random | None = None
    """Seeds the router's random choices (tests and benches); None: an unseeded one."""

    @classmethod
    def from_settings(cls, settings: GatewaySettings, *, store: Store, clock: Clock) -> GatewayDeps:
        """The fleet and tenants from the files the settings name; every other resource from the settings."""
        return cls(settings, store=store, clock=clock, fleet=settings.fleet(), tenants=settings.tenants())


@dataclass
class Gateway:
    """Everything the request pipeline works with."""

    settings: GatewaySettings
    fleet: FleetConfig
    tenants: TenantsConfig
    store: Store
    clock: Clock
    metrics: GatewayMetrics
    keys: KeyRing
    admitter: Admitter
    pool: WorkerPool
    router: Router
    upstream: Upstream
    ledger: LedgerWriter
    tracer: trace.Tracer | None
    """None when tracing is off (``gateway.usage.tracing``)."""
    body_rules: BodyRules
    replicas: ReplicaRegistry
    overload: OverloadGate
    tenant_book: TenantBook
    """The tenants file merged with the run-time changes; ``tenants`` is its set in force."""
    admin_guard: AdminGuard
    """Authenticates ``/admin/`` requests before their bodies are read, and rate limits failures."""
    prefix: PrefixIndex | None = None
    """Which workers recently served which prompt blocks (``gateway.routing.prefix``); None with prefix affinity off."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def use_tenants(self, tenants: TenantsConfig) -> None:
        """Serve ``tenants`` from now on (the set in force changed at run time)."""
        self.tenants = tenants
        self.keys.use(tenants)


@contextlib.asynccontextmanager
async def running_gateway(deps: GatewayDeps) -> AsyncIterator[Gateway]:
    """Build every resource, start the background loops, and tear it all down on exit."""
    settings, store, clock, fleet, tenants = deps.settings, deps.store, deps.clock, deps.fleet, deps.tenants
    upstream_session, rng = deps.upstream_session, deps.rng
    metrics = GatewayMetrics(deps.registry, tenant_label=settings.tenant_labeler())
    session = upstream_session or new_session(settings)
    tracing = build_tracing(settings, exporter=deps.span_exporter)
    pool = WorkerPool(fleet=fleet, store=store, clock=clock, settings=settings, metrics=metrics)
    prefix = (
        PrefixIndex(ttl_s=settings.prefix_ttl_s, capacity=settings.prefix_index_blocks)
        if settings.weight_prefix > 0
        else None
    )
    await store.verify()  # a cluster node without GEARSHIFT_REDIS_CLUSTER (or the reverse) is refused here
    replicas = ReplicaRegistry.from_settings(store, clock=clock, settings=settings)
    admitter = Admitter.from_settings(store, clock=clock, metrics=metrics, settings=settings, replicas=replicas)
    ledger = LedgerWriter.from_settings(store, clock=clock, metrics=metrics, settings=settings, admitter=admitter)
    gw = Gateway(
        settings=settings,
        fleet=fleet,
        tenants=tenants,
        store=store,
        clock=clock,
        metrics=metrics,
        keys=KeyRing.from_settings(tenants, store, clock=clock, settings=settings),
        admitter=admitter,
        pool=pool,
        router=default_router(settings, fleet, tenants, metrics=metrics, prefix=prefix, rng=rng),
        upstream=Upstream(session, pool=pool, settings=settings, metrics=metrics),
        ledger=ledger,
        tracer=tracing.tracer,
        body_rules=BodyRules.from_settings(settings),
        overload=OverloadGate(pool, settings=settings, metrics=metrics, clock=clock),
        replicas=replicas,
        tenant_book=TenantBook(tenants, store, on_change=lambda in_force: gw.use_tenants(in_force)),
        admin_guard=AdminGuard(
            settings.admin_credentials, clock=clock, failures=settings.admin_auth_failures_per_minute
        ),
        prefix=prefix,
    )
    await gw.tenant_book.load()
    ledger.start()
    gw.tasks = [
        asyncio.create_task(pool.run_loop("shared-state", pool.refresh_shared, settings.state_refresh_s)),
        asyncio.create_task(pool.run_loop("replicas", replicas.beat, settings.replica_heartbeat_s)),
        asyncio.create_task(pool.run_loop("health", lambda: pool.probe_health(session), settings.health_interval_s)),
        asyncio.create_task(pool.run_loop("overload", gw.overload.tick, settings.overload_tick_s)),
        asyncio.create_task(pool.run_loop("tenants", gw.tenant_book.refresh, settings.tenants_refresh_s)),
    ]
    if metrics.multiprocess:  # the measured gauges reach the other processes' scrapes through the files
        gw.tasks.append(asyncio.create_task(pool.run_loop("metrics", metrics.sample_tick, SAMPLE_S)))
    try:
        yield gw
    finally:
        for task in gw.tasks:
            task.cancel()
        await asyncio.gather(*gw.tasks, return_exceptions=True)
        await admitter.close()  # the leases' unused parts back to the store
        await ledger.close()
        if upstream_session is None:
            await session.close()
        await asyncio.to_thread(tracing.shutdown)  # flushes spans with blocking HTTP: keep it off the loop
