"""``/gearshift/v1/restart`` on the simulated worker (``fleet.restart``): restart with or without the drafter,
taking the profile's ``restart_s``. While it restarts, every other route (``/health`` and ``/metrics`` too)
answers 503, as a worker whose engine is down would. With ``restart_falls_back`` (a fault) the restart comes back
in the mode it left, as the vLLM supervisor does when the new mode fails to start.
"""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web
from pydantic import ValidationError

from fleet.bearer import bearer_matches
from fleet.restart import RESTART_PATH, RestartRequest, RestartState
from workers.sim.errors import BadRequest, Conflict, Handler, Unauthorized, Unavailable, from_validation_error
from workers.sim.worker import WORKER, SimWorker

RESTARTS = web.AppKey("restarts", set[asyncio.Task[None]])
"""Restarts under way (kept so that they are not collected, and cancelled at clean-up)."""


def _state(worker: SimWorker) -> RestartState:
    restart_s = worker.profile.serving.restart_s
    return RestartState(
        drafter=worker.drafter_loaded, restarting=worker.restarting, restarts=worker.restarts, restart_s=restart_s
    )


async def get_restart(request: web.Request) -> web.Response:
    return web.json_response(text=_state(request.app[WORKER]).model_dump_json())


async def post_restart(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    if not bearer_matches(request.headers.get("Authorization"), worker.settings.control_token.get_secret_value()):
        raise Unauthorized("missing or wrong control token (Authorization: Bearer <GEARSHIFT_CONTROL_TOKEN>)")
    try:
        body = RestartRequest.model_validate(orjson.loads(await request.read()))
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON body: {exc}") from exc
    except ValidationError as exc:
        raise from_validation_error(exc) from exc
    if worker.restarting:
        raise Conflict("a restart is already under way", param="drafter")
    worker.restarting = True  # before the task runs: the next request already sees it
    drafter = worker.drafter_loaded if worker.settings.restart_falls_back else body.drafter
    task = asyncio.create_task(worker.restart(drafter=drafter), name=f"restart-{worker.settings.worker_id}")
    tasks = request.app[RESTARTS]
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return web.json_response(text=RestartState(
        drafter=body.drafter, restarting=True, restarts=worker.restarts, restart_s=worker.profile.serving.restart_s
    ).model_dump_json(), status=202)  # fmt: skip


@web.middleware
async def restart_gate(request: web.Request, handler: Handler) -> web.StreamResponse:
    """503 for everything but the restart route while the worker restarts."""
    if request.app[WORKER].restarting and request.path != RESTART_PATH:
        raise Unavailable("the worker is restarting")
    return await handler(request)


async def _cancel_restarts(app: web.Application) -> None:
    tasks: set[asyncio.Task[None]] = app[RESTARTS]
    for task in tuple(tasks):
        task.cancel()


def add_routes(app: web.Application) -> None:
    app[RESTARTS] = set()
    app.router.add_get(RESTART_PATH, get_restart)
    app.router.add_post(RESTART_PATH, post_restart)
    app.on_cleanup.append(_cancel_restarts)
