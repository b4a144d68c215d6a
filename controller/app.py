"""Assembly of a running controller from settings: the metrics source, the actuator, the store, its own
``/metrics`` endpoint. Used by ``gearshift controller`` and, as a component, by ``gearshift up``.
"""

from __future__ import annotations

import asyncio
import os
import socket

import httpx
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from controller.actuator import HttpActuator
from controller.gear_mode import GearModes, HttpRestarter
from controller.loop import Controller
from controller.metrics import ControllerMetrics
from controller.settings import ControllerSettings, SourceKind
from controller.sources import HttpScrapeSource, MetricsSource, PrometheusSource
from fleet.bearer import bearer_matches
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


METRICS_PATH = "/metrics"


def metrics_app(registry: CollectorRegistry, *, token: str | None) -> web.Application:
    """The controller's ``GET /metrics``: ``registry`` in the exposition format the scraper's ``Accept`` asks for;
    with ``token`` (``GEARSHIFT_METRICS_TOKEN``) only for ``Authorization: Bearer <token>`` (compared in constant
    time, ``fleet.bearer``; 401 otherwise), as the gateway's ``/metrics``."""

    async def metrics(request: web.Request) -> web.Response:
        if token is not None and not bearer_matches(request.headers.get("Authorization"), token):
            message = "/metrics needs the metrics token: send 'Authorization: Bearer <GEARSHIFT_METRICS_TOKEN>'."
            error = {"message": message, "type": "authentication_error", "code": "invalid_metrics_token"}
            return web.json_response({"error": error}, status=401)
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encoder(registry), headers={"Content-Type": content_type})

    app = web.Application()
    app.router.add_get(METRICS_PATH, metrics)
    return app


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
        self._metrics: web.AppRunner | None = None

    async def start(self) -> None:
        await self.store.verify()  # a cluster node without GEARSHIFT_REDIS_CLUSTER (or the reverse) is refused here
        self._client = httpx.AsyncClient()
        self.controller = build_controller(self.settings, store=self.store, client=self._client, clock=self.clock)
        if self.settings.metrics_port:
            token = self.settings.metrics_token
            app = metrics_app(self.controller.metrics.registry, token=token.get_secret_value() if token else None)
            self._metrics = web.AppRunner(app, access_log=None)
            await self._metrics.setup()
            await web.TCPSite(self._metrics, self.settings.metrics_host, self.settings.metrics_port).start()
        self._stop.clear()
        self._task = asyncio.create_task(self.controller.run(self._stop), name="gearshift-controller")

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
        if self._metrics is not None:
            await self._metrics.cleanup()
            self._metrics = None
        if self._client is not None:
            await self._client.aclose()
        if self._own_store:
            await self.store.close()

    def describe(self) -> list[str]:
        s = self.settings
        mode = "dry-run (shadow): decides, never applies" if s.dry_run else "applies k to workers"
        lines = [f"tick {s.tick_s:g} s, {mode}, source: {s.source.value}"]
        if s.metrics_port:
            guard = " (bearer token)" if s.metrics_token is not None else ""
            lines.append(f"metrics: http://{s.metrics_host}:{s.metrics_port}{METRICS_PATH}{guard}")
        if s.canary_worker:
            lines.append(f"canary worker: {s.canary_worker} ({s.canary_ticks} ticks)")
        return lines

    async def wait(self) -> None:
        """Until the loop ends (after ``stop``)."""
        if self._task is not None:
            await self._task
