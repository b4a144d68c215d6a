"""``/gearshift/v1/speculation``: the worker speculation-control API of DESIGN §3.1 on the simulator."""

from __future__ import annotations

import orjson
from aiohttp import web
from pydantic import ValidationError

from fleet.bearer import bearer_matches
from fleet.speculation import SPECULATION_PATH, ScheduleError, SpeculationUpdate, StaleVersionError
from workers.sim.errors import BadRequest, Conflict, Unauthorized, from_validation_error
from workers.sim.worker import WORKER


def _authorise(request: web.Request) -> None:
    expected = request.app[WORKER].settings.control_token.get_secret_value()
    if not bearer_matches(request.headers.get("Authorization"), expected):
        raise Unauthorized("missing or wrong control token (Authorization: Bearer <GEARSHIFT_CONTROL_TOKEN>)")


async def get_speculation(request: web.Request) -> web.Response:
    control = request.app[WORKER].control
    control.expire()
    return web.json_response(text=control.state().model_dump_json())


async def put_speculation(request: web.Request) -> web.Response:
    _authorise(request)
    try:
        update = SpeculationUpdate.model_validate(orjson.loads(await request.read()))
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON body: {exc}") from exc
    except ValidationError as exc:
        raise from_validation_error(exc) from exc
    control = request.app[WORKER].control
    control.expire()
    try:
        state = control.apply(update)
    except StaleVersionError as exc:
        raise Conflict(str(exc), param="version") from exc
    except ScheduleError as exc:
        raise BadRequest(str(exc), param="schedule") from exc
    return web.json_response(text=state.model_dump_json())


def add_routes(app: web.Application) -> None:
    app.router.add_get(SPECULATION_PATH, get_speculation)
    app.router.add_put(SPECULATION_PATH, put_speculation)
