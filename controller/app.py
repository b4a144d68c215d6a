"""Assembly of a running controller from settings: the metrics source, the actuator, the store, its own
``/metrics`` endpoint. Used by ``gearshift controller`` and, as a component, by ``gearshift up``.
"""

from __future__ import annotations

import asyncio
import os
import socket
from wsgiref.simple_server import WSGIServer

import httpx
from prometheus_client import start_http_server

from controller.actuator import HttpActuator
from controller.gear_mode import GearModes, HttpRestarter
from controller.loop import Controller
from controller.metrics import ControllerMetrics
from controller.settings import ControllerSettings, SourceKind
from controller.sources import HttpScrapeSource, MetricsSource, PrometheusSource
from fleet.clock import Clock, SystemClock
from fleet.config import CommonSettings, FleetConfig
from fleet.perf import load_profile
from fleet.store.factory import build_store
from fleet.store.protocol import Store


def default_holder_id() -> str:
    """This replica's name in the leader lease: host name and process id."""
    return f"{socket.gethostname()}-{os.getpid()}"


def controller_settings_from(common: CommonSettings, **overrides: object) -> ControllerSettings:
    """``ControllerSettings`` from the environment, keeping the shared fields of an existing ``common``."""
    shared = {name: getattr(common, name) for name in CommonSettings.model_fields}
    return ControllerSettings(**{**shared, **overrides})


def build_source(settings: ControllerSettings, client: httpx.AsyncClient, clock: Clock) -> MetricsSource:
    if settings.source is SourceKind.PROMETHEUS:
        assert settings.prometheus_url is not None  # the settings validator requires it
        return PrometheusSource(client, base_url=settings.prometheus_url, clock=clock)
    return HttpScrapeSource(client, clock=clock)


def build_gear_modes(
    settings: ControllerSettings, fleet: FleetConfig, *, store: Store, client: httpx.AsyncClient, clock: Clock
) -> GearModes:
    """The drafter-free gear over HTTP (``fleet.restart``); workers whose profile models no ``restart_s`` are
    never moved, and a dry run moves none."""
    restart_s = {}
    for w in fleet.workers:
        model = fleet.model(w.model)
        seconds = load_profile(model.profile).serving.restart_s if model is not None else None
        if seconds is not None:
            restart_s[w.id] = seconds
    return GearModes(
        workers=fleet.workers,
        restart_s=restart_s,
        config=settings.drafter_free.model_copy(
            update={"enabled": settings.drafter_free.enabled and not settings.dry_run}
        ),
        restarter=HttpRestarter(client, control_token=settings.control_token.get_secret_value()),
        store=store,
        clock=clock,
    )


def build_controller(
    settings: ControllerSettings,
    *,
    store: Store,
    client: httpx.AsyncClient,
    clock: Clock,
    metrics: ControllerMetrics | None = None,
) -> Controller:
    fleet = settings.fleet()
    return Controller(
        fleet=fleet,
        tenants=settings.tenants(),
        settings=settings,
        source=build_source(settings, client, clock),
        actuator=HttpActuator(client, control_token=settings.control_token.get_secret_value()),
        store=store,
        clock=clock,
        metrics=metrics,
        holder_id=settings.holder_id or default_holder_id(),
        gear_modes=build_gear_modes(settings, fleet, store=store, client=client, clock=clock),
    )


class ControllerComponent:
    """The controller as a start/stop component (``gearshift up``, ``gearshift controller``)."""

    name = "controller"

    def __init__(self, settings: ControllerSettings, *, store: Store | None = None, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self._own_store = store is None
        self.store = store if store is not None else build_store(settings, clock=self.clock)
        self.controller: Controller | None = None
        self._client: httpx.AsyncClient | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._http: WSGIServer | None = None

    async def start(self) -> None:
        await self.store.verify()  # a cluster node without GEARSHIFT_REDIS_CLUSTER (or the reverse) is refused here
        self._client = httpx.AsyncClient()
        self.controller = build_controller(self.settings, store=self.store, client=self._client, clock=self.clock)
        if self.settings.metrics_port:
            self._http, _ = start_http_server(
                self.settings.metrics_port, addr=self.settings.metrics_host, registry=self.controller.metrics.registry
            )
        self._stop.clear()
        self._task = asyncio.create_task(self.controller.run(self._stop), name="gearshift-controller")

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        if self._client is not None:
            await self._client.aclose()
        if self._own_store:
            await self.store.close()

    def describe(self) -> list[str]:
        s = self.settings
        mode = "dry-run (shadow): decides, never applies" if s.dry_run else "applies k to workers"
        lines = [f"tick {s.tick_s:g} s, {mode}, source: {s.source.value}"]
        if s.metrics_port:
            lines.append(f"metrics: http://{s.metrics_host}:{s.metrics_port}/metrics")
        if s.canary_worker:
            lines.append(f"canary worker: {s.canary_worker} ({s.canary_ticks} ticks)")
        return lines

    async def wait(self) -> None:
        """Until the loop ends (after ``stop``)."""
        if self._task is not None:
            await self._task
