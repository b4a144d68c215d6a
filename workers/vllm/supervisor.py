"""The vLLM supervisor (issue 14): runs a worker's vLLM server as a child process and restarts it with or
without its drafter on request (``fleet.restart``), so the controller can take the worker to the drafter-free
gear and back once it is drained (``controller.gear_mode``).

It listens on the fleet entry's ``restart_url`` (``gearshift worker vllm --supervise``); vLLM keeps the worker's
``url``. A restart stops vLLM's whole process group (SIGTERM, then SIGKILL after ``stop_timeout_s``), starts the
other command line (``workers.vllm.launcher.build_launch(drafter=…)``) and waits for its ``/health``; if that
fails it starts the old one again (the controller then serves the worker in its old mode). Requests still
on the worker fail with it: the controller restarts only a drained worker. The supervisor imports no vLLM.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

import orjson
from aiohttp import web
from pydantic import SecretStr, ValidationError

from fleet.bearer import bearer_matches
from fleet.config import exposure, refuse_dev_secrets
from fleet.restart import RESTART_PATH, RestartRequest, RestartState
from workers.vllm.cpu_server import wait_healthy
from workers.vllm.launcher import LaunchPlan
from workers.vllm.spawn import VllmProcess, log_path

log = logging.getLogger("gearshift.vllm.supervisor")

PlanFor = Callable[[bool], LaunchPlan]
"""``drafter`` → the vLLM command line of the worker in that mode."""


class Supervisor:
    """One vLLM server process and its mode; ``restart`` swaps the process for one in the other mode."""

    def __init__(
        self,
        plan_for: PlanFor,
        *,
        url: str,
        log_dir: Path,
        drafter: bool = True,
        ready_timeout_s: float = 1800.0,
        stop_timeout_s: float = 60.0,
    ) -> None:
        """``url``: where vLLM answers ``/health``; ``ready_timeout_s``: longest start (weights, graph capture), s."""
        self.plan_for = plan_for
        self.url = url
        self.log_dir = log_dir
        self.drafter = drafter
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.restarting = False
        self.restarts = 0
        self.last_restart_s: float | None = None
        """How long the last restart took, seconds (None before the first)."""
        self.vllm = VllmProcess()

    def state(self) -> RestartState:
        return RestartState(
            drafter=self.drafter, restarting=self.restarting, restarts=self.restarts, restart_s=self.last_restart_s
        )

    def start(self) -> None:
        """Start vLLM in the current mode and wait until it is healthy (blocking)."""
        output = log_path(self.log_dir, self.restarts, drafter=self.drafter)
        proc = self.vllm.start(self.plan_for(self.drafter), log=output)
        wait_healthy(self.url, proc, timeout_s=self.ready_timeout_s, log_path=output)

    def stop(self) -> None:
        """Stop vLLM's process group (blocking)."""
        self.vllm.stop(timeout_s=self.stop_timeout_s)

    async def restart(self, *, drafter: bool) -> None:
        """Stop vLLM and start it again with (or without) the drafter; ``restarting`` until it is healthy."""
        self.restarting = True
        started, before = time.monotonic(), self.drafter
        self.drafter = drafter  # while restarting, the state names the mode it is starting in (followers read it)
        try:
            await asyncio.to_thread(self.stop)
            try:
                await asyncio.to_thread(self.start)
            except Exception:  # back in the old mode: the controller sees it and serves the worker as before
                log.exception("vLLM did not start in the new mode; starting it as before")
                await asyncio.to_thread(self.stop)
                self.drafter = before
                await asyncio.to_thread(self.start)
            self.restarts += 1
            self.last_restart_s = time.monotonic() - started
            mode = "with its drafter" if self.drafter else "drafter-free"
            log.info("vLLM restarted %s in %.0f s", mode, self.last_restart_s)
        finally:
            self.restarting = False


SUPERVISOR = web.AppKey("supervisor", Supervisor)
TASKS = web.AppKey("tasks", set[asyncio.Task[None]])


def _reply(state: RestartState, status: int = 200) -> web.Response:
    return web.json_response(text=state.model_dump_json(), status=status)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "restart_error", "code": status}}, status=status)


def supervisor_app(supervisor: Supervisor, *, control_token: str) -> web.Application:
    """``GET``/``POST /gearshift/v1/restart`` (``fleet.restart``) over ``supervisor``."""
    app = web.Application()
    app[SUPERVISOR] = supervisor
    app[TASKS] = set()

    async def get_state(request: web.Request) -> web.Response:
        return _reply(supervisor.state())

    async def post_restart(request: web.Request) -> web.Response:
        if not bearer_matches(request.headers.get("Authorization"), control_token):
            return _error(401, "missing or wrong control token")
        try:
            body = RestartRequest.model_validate(orjson.loads(await request.read()))
        except (orjson.JSONDecodeError, ValidationError) as exc:
            return _error(400, f"bad restart request: {exc}")
        if supervisor.restarting:
            return _error(409, "a restart is already under way")
        supervisor.restarting = True  # the next request sees it before the task runs
        task = asyncio.create_task(supervisor.restart(drafter=body.drafter))
        tasks: set[asyncio.Task[None]] = app[TASKS]
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return _reply(supervisor.state().model_copy(update={"drafter": body.drafter}), status=202)

    async def cleanup(app: web.Application) -> None:
        tasks: set[asyncio.Task[None]] = app[TASKS]
        for task in tuple(tasks):
            task.cancel()

    app.router.add_get(RESTART_PATH, get_state)
    app.router.add_post(RESTART_PATH, post_restart)
    app.on_cleanup.append(cleanup)
    return app


def restart_bind_host(url: str) -> str:
    """The address the restart control listens on for ``restart_url`` ``url``: its host when that is an IP literal
    (``localhost``: 127.0.0.1); for a DNS name, the first address it resolves to that is this machine's (a pod's own
    name, a name in ``/etc/hosts``), so the control listens on that interface only; every interface (``0.0.0.0``)
    only when the name resolves to no local address (a Kubernetes Service name) or not at all."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return "127.0.0.1"
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return "0.0.0.0"
    for family, _, _, _, address in infos:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address[0], 0))  # only a local address can be bound
            except OSError:
                continue
        return str(address[0])
    return "0.0.0.0"


def refuse_weak_control_token(control_token: str, *, host: str, redis_url: str | None, allow_dev_secrets: bool) -> None:
    """The dev-secret guard of every gearshift server (``fleet.config.refuse_dev_secrets``) for the restart control:
    listening beyond loopback on ``host``, or in shared mode (``redis_url``), the development control token is
    refused (``ConfigError``) unless ``allow_dev_secrets`` (``GEARSHIFT_ALLOW_DEV_SECRETS=1``)."""
    refuse_dev_secrets(
        {"control_token": SecretStr(control_token)},
        exposed=exposure(redis_url=redis_url, host=host),
        allowed=allow_dev_secrets,
    )


async def serve(
    supervisor: Supervisor,
    *,
    host: str,
    port: int,
    control_token: str,
    stop: asyncio.Event,
    on_ready: Callable[[], Awaitable[None]] | None = None,
    redis_url: str | None = None,
    allow_dev_secrets: bool = False,
) -> None:
    """Start vLLM, await ``on_ready`` once it is healthy, serve the restart control on ``host:port`` until ``stop``,
    then stop vLLM. A development control token beyond loopback or in shared mode (``redis_url``) is refused before
    anything starts (``refuse_weak_control_token``)."""
    refuse_weak_control_token(control_token, host=host, redis_url=redis_url, allow_dev_secrets=allow_dev_secrets)
    await asyncio.to_thread(supervisor.start)
    if on_ready is not None:
        await on_ready()
    runner = web.AppRunner(supervisor_app(supervisor, control_token=control_token), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        log.info("supervising vLLM at %s; restart control on %s:%d%s", supervisor.url, host, port, RESTART_PATH)
        await stop.wait()
    finally:
        await runner.cleanup()
        await asyncio.to_thread(supervisor.stop)
