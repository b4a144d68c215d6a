"""The gearshift vLLM plugin: its two entry points (named in pyproject.toml).

- ``vllm.general_plugins`` → ``register_engine_hooks``: runs in every vLLM process; adds the speculation
  method to ``EngineCore`` and a lease check before each engine step, and puts the idle-drafter skip into
  the model runner the process builds (``workers.vllm.idle_drafter``). Inert where no engine is built.
- ``vllm.endpoint_plugins`` → ``register_routes``: returns the endpoint plugin that serves
  ``GET/PUT /gearshift/v1/speculation`` on vLLM's API server.

vLLM loads endpoint plugins only when named in ``VLLM_PLUGINS``, and that list then filters general
plugins too, so run vLLM with ``VLLM_PLUGINS=gearshift`` (both entry points carry that name).
"""

from __future__ import annotations

import asyncio
import logging
from argparse import Namespace
from typing import Any

from fastapi import FastAPI
from prometheus_client import REGISTRY

from fleet.clock import SystemClock
from workers.vllm import idle_drafter, internals
from workers.vllm.api import STATE_ATTR, SpeculationFront, create_router, poll_forever
from workers.vllm.control import EngineSpeculation, Reply
from workers.vllm.settings import IdleDrafter, VllmPluginSettings
from workers.vllm.spec_metrics import WorkerSpecMetrics

log = logging.getLogger("vllm.gearshift")

PLUGIN_NAME = "gearshift"
_ENGINE_ATTR = "_gearshift_speculation"


# ------------------------------------------------------------------------------------------ engine side
def _speculation_of(engine_core: Any) -> EngineSpeculation:
    """The engine's ``EngineSpeculation``, built on first use (the scheduler exists by then)."""
    spec: EngineSpeculation | None = getattr(engine_core, _ENGINE_ATTR, None)
    if spec is None:
        view = internals.engine_view(engine_core)
        try:
            worker_id = VllmPluginSettings().worker_id
        except ValueError as exc:  # bad GEARSHIFT_* settings: refuse control, keep the engine serving
            spec = EngineSpeculation.disabled(view, f"speculation control is disabled: invalid settings: {exc}")
        else:
            spec = EngineSpeculation(view, worker_id=worker_id, clock=SystemClock())
        setattr(engine_core, _ENGINE_ATTR, spec)
    return spec


def _handle(engine_core: Any, request: dict[str, Any]) -> Reply:
    return _speculation_of(engine_core).handle(request)


def _before_step(engine_core: Any) -> None:
    _speculation_of(engine_core).before_step()


def register_engine_hooks() -> None:
    """``vllm.general_plugins`` entry point; safe to call in any vLLM process, any number of times."""
    try:
        if internals.install_engine_hooks(handle=_handle, before_step=_before_step):
            log.debug("gearshift: engine hooks installed")
    except Exception:  # never break vLLM's start-up because of the plugin
        log.exception("gearshift: installing the engine hooks failed; speculation control is disabled")
    try:
        mode = VllmPluginSettings().idle_drafter
    except ValueError as exc:  # bad GEARSHIFT_* settings: the drafter runs as stock vLLM runs it
        log.error("gearshift: idle-drafter skip off: invalid settings: %s", exc)
        mode = IdleDrafter.STOCK
    try:
        idle_drafter.install(mode)
    except Exception:
        log.exception("gearshift: installing the idle-drafter skip failed; the drafter runs as in stock vLLM")


# ---------------------------------------------------------------------------------------- API server side
class GearshiftEndpoints:
    """vLLM ``EndpointPlugin``: the speculation-control routes and their per-app state."""

    name = PLUGIN_NAME
    required_tasks = ("generate",)

    def __init__(self) -> None:
        self._poller: asyncio.Task[None] | None = None

    def attach_router(self, app: FastAPI) -> None:
        app.include_router(create_router())

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        if engine_client is None:
            log.error("gearshift: no engine in this API server; speculation control is disabled")
            return
        settings = VllmPluginSettings(host=args.host or "")  # vLLM listens on every interface without --host

        async def channel(request: dict[str, Any]) -> Reply:
            return await internals.call_engine(engine_client, request)

        front = SpeculationFront(
            channel, token=settings.control_token.get_secret_value(), metrics=WorkerSpecMetrics(REGISTRY)
        )
        setattr(state, STATE_ATTR, front)
        self._poller = asyncio.create_task(
            poll_forever(front, clock=SystemClock(), interval_s=settings.spec_poll_seconds),
            name="gearshift-speculation-poller",
        )
        log.info("gearshift: speculation control served at /gearshift/v1/speculation (worker %s)", settings.worker_id)


def register_routes() -> GearshiftEndpoints:
    """``vllm.endpoint_plugins`` entry point: a factory vLLM calls once in the API server."""
    return GearshiftEndpoints()
