"""The HTTP side of speculation control, mounted on vLLM's own API server (DESIGN §3.1).

``GET /gearshift/v1/speculation`` returns ``SpeculationState``; ``PUT`` takes ``SpeculationUpdate`` and needs
``Authorization: Bearer <GEARSHIFT_CONTROL_TOKEN>``. Both forward to the engine through an ``EngineChannel``
(the real one is a vLLM utility call, see ``internals.call_engine``; tests pass ``EngineSpeculation.handle``
behind a fake). Errors are ``{"error": {"message", "type", "param", "code"}}`` like vLLM's own and the
simulator's: 400 invalid body or table,
401 token, 409 stale version or no per-batch-size table, 503 engine unreachable.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from fleet.bearer import bearer_matches
from fleet.clock import Clock
from fleet.speculation import SPECULATION_PATH, SpeculationState
from workers.vllm.control import STATUS_OK, UNAVAILABLE_TYPE, EngineSideMissing, Reply, error_reply
from workers.vllm.spec_metrics import WorkerSpecMetrics

log = logging.getLogger("vllm.gearshift")

STATE_ATTR = "gearshift_speculation"
"""Attribute of the app state that holds the ``SpeculationFront``."""

EngineChannel = Callable[[dict[str, Any]], Awaitable[Reply]]
"""Sends one request to the engine-side ``EngineSpeculation.handle`` and returns its reply."""

STATUS_UNAUTHORIZED = 401
STATUS_UNAVAILABLE = 503
_NOT_INITIALISED = error_reply(STATUS_UNAVAILABLE, "engine_unavailable", "speculation control is not initialised")


class SpeculationFront:
    """API-server half: checks the token, forwards to the engine, mirrors replies into the metrics."""

    def __init__(self, channel: EngineChannel, *, token: str, metrics: WorkerSpecMetrics | None) -> None:
        self._channel = channel
        self._token = token
        self._metrics = metrics
        self._logged_unavailable = False

    def authorized(self, header: str | None) -> bool:
        """Whether ``header`` (``Authorization``) carries the control token as Bearer."""
        return bearer_matches(header, self._token)

    async def get(self) -> Reply:
        return await self._call({"op": "get"})

    async def put(self, update: Any) -> Reply:
        return await self._call({"op": "put", "update": update})

    async def _call(self, request: dict[str, Any]) -> Reply:
        try:
            reply = await self._channel(request)
        except Exception as exc:  # engine gone, or its side of the plugin not loaded
            return error_reply(STATUS_UNAVAILABLE, "engine_unavailable", _engine_failure(exc))
        if reply.get("status") == STATUS_OK:
            if self._metrics is not None:
                self._metrics.observe(SpeculationState.model_validate(reply["state"]), int(reply["lease_expiries"]))
        elif reply.get("type") == UNAVAILABLE_TYPE and not self._logged_unavailable:
            log.error("gearshift: %s", reply.get("error"))
            self._logged_unavailable = True
        return reply


def _engine_failure(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, EngineSideMissing):
        return (
            "the engine side of the gearshift plugin is not loaded in the EngineCore process: set "
            f"VLLM_PLUGINS=gearshift (it names both entry points) and restart vLLM ({text})"
        )
    return f"the engine did not answer the speculation control call: {text}"


_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    409: "ConflictError",
    503: "ServiceUnavailableError",
}
"""vLLM's (and the simulator's) error type names by HTTP status."""
_ERROR_PARAMS = {
    "invalid_schedule": "schedule",
    "stale_version": "version",
    UNAVAILABLE_TYPE: "speculative_config",
}
"""Which part of the request or server an error kind is about (``param`` in the error body)."""


def render(reply: Reply) -> JSONResponse:
    """Map an engine reply to the HTTP response: ``{"error": {"message", "type", "param", "code"}}`` on errors."""
    status = int(reply.get("status", STATUS_UNAVAILABLE))
    if status == STATUS_OK:
        return JSONResponse(reply["state"])
    kind = str(reply.get("type", ""))
    error = {
        "message": reply.get("error", ""),
        "type": _ERROR_TYPES.get(status, "InternalServerError"),
        "param": reply.get("param", _ERROR_PARAMS.get(kind)),
        "code": status,
    }
    return JSONResponse({"error": error}, status_code=status)


def create_router() -> APIRouter:
    """Routes that read the ``SpeculationFront`` from ``app.state`` (set by the plugin's ``init_state``)."""
    router = APIRouter(tags=["gearshift"])

    def front_of(request: Request) -> SpeculationFront | None:
        front = getattr(request.app.state, STATE_ATTR, None)
        return front if isinstance(front, SpeculationFront) else None

    @router.get(SPECULATION_PATH)
    async def get_speculation(request: Request) -> JSONResponse:
        front = front_of(request)
        if front is None:
            return render(_NOT_INITIALISED)
        return render(await front.get())

    @router.put(SPECULATION_PATH)
    async def put_speculation(request: Request) -> JSONResponse:
        front = front_of(request)
        if front is None:
            return render(_NOT_INITIALISED)
        if not front.authorized(request.headers.get("authorization")):
            message = "authorization: missing or wrong control token (send 'Authorization: Bearer <token>')"
            return render(error_reply(STATUS_UNAUTHORIZED, "unauthorized", message))
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            return render(error_reply(400, "invalid_request", f"body: not valid JSON: {exc}"))
        return render(await front.put(body))

    return router


async def poll_forever(
    front: SpeculationFront, *, clock: Clock, interval_s: float, max_backoff_s: float = 30.0
) -> None:
    """Read the engine's state now and every ``interval_s`` seconds (metrics; lease expiry on an idle engine).

    Never dies of a failed read: failures back off exponentially up to ``max_backoff_s`` and are logged.
    Returns when the engine says control is unavailable (no table, no speculation): that lasts as long as it runs.
    """
    delay = interval_s
    while True:
        try:
            reply = await front.get()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("gearshift: reading the speculation state failed")
            reply = {"status": STATUS_UNAVAILABLE}
        if reply.get("type") == UNAVAILABLE_TYPE:
            return
        failed = reply.get("status") == STATUS_UNAVAILABLE
        delay = min(delay * 2, max_backoff_s) if failed else interval_s
        await clock.sleep(delay)
