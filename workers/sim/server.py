"""The simulated worker's HTTP server: vLLM's OpenAI endpoints, ``/metrics``, ``/health``, ``/version`` and
the speculation-control API, on aiohttp.

``create_app(settings, clock=…)`` builds the app (the engine loop starts and stops with it);
``SimServer`` runs one on a TCP port (port 0 picks a free one) inside an existing event loop.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from aiohttp import web

from fleet.clock import Clock, SystemClock
from workers.sim import control_api, openai_api, responses_api, restart_api
from workers.sim.errors import error_middleware
from workers.sim.exposition import CONTENT_TYPE
from workers.sim.settings import SimWorkerSettings
from workers.sim.worker import WORKER, SimWorker

log = logging.getLogger(__name__)

VLLM_VERSION = "0.32.0"
"""The vLLM release whose API and metrics the simulator reproduces (what ``/version`` reports)."""


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": VLLM_VERSION, "simulated": True})


async def models(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    s = worker.settings
    card = {
        "id": s.model,
        "object": "model",
        "created": int(worker.started_at),
        "owned_by": "vllm",
        "root": s.model,
        "parent": None,
        "max_model_len": s.context_window,
        "permission": [],
    }
    return web.json_response({"object": "list", "data": [card]})


async def metrics(request: web.Request) -> web.Response:
    body = request.app[WORKER].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def create_app(settings: SimWorkerSettings, *, clock: Clock | None = None) -> web.Application:
    """The worker's aiohttp application; its engine loop runs from app start-up to clean-up."""
    worker = SimWorker(settings, clock=clock or SystemClock())
    app = web.Application(middlewares=[error_middleware, restart_api.restart_gate], client_max_size=64 * 1024 * 1024)
    app[WORKER] = worker
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    openai_api.add_routes(app)
    responses_api.add_routes(app)
    control_api.add_routes(app)
    restart_api.add_routes(app)

    async def lifespan(app: web.Application) -> AsyncIterator[None]:
        await worker.start()
        yield
        await worker.stop()

    app.cleanup_ctx.append(lifespan)
    return app


class SimServer:
    """One simulated worker listening on ``settings.host:settings.port`` in the running event loop."""

    def __init__(self, settings: SimWorkerSettings, *, clock: Clock | None = None) -> None:
        self.settings = settings
        self.app = create_app(settings, clock=clock)
        # Cancel a handler when its client disconnects, so a dropped request stops using the engine.
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        self.port: int | None = None

    @property
    def worker(self) -> SimWorker:
        return self.app[WORKER]

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("server not started")
        return f"http://{self.settings.host}:{self.port}"

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        log.info("simulated worker %s serving %s at %s", self.settings.worker_id, self.settings.model, self.url)

    async def stop(self) -> None:
        await self._runner.cleanup()
