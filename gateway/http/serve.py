"""Serving the gateway with uvicorn (httptools) inside a running event loop, for the CLI, ``gearshift up``
and tests. Call ``start`` and ``stop`` from the same loop."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

from gateway.http.app import create_app
from gateway.http.protocol import guarded_protocol
from gateway.wiring import Gateway, GatewayDeps

_START_TIMEOUT_S = 30.0


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its host process (``gearshift up``)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _StandaloneServer(uvicorn.Server):
    """A uvicorn server that shuts down gracefully on SIGINT/SIGTERM and then returns normally. (uvicorn's
    own re-raises the signal after the shutdown, so a clean stop would exit with status -15, read as a crash.)"""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class GatewayServer:
    """One gateway listening on ``settings.host:settings.port`` (port 0 picks a free one). With
    ``handle_signals=False`` the host process handles Ctrl-C and calls ``stop``."""

    name = "gateway"

    def __init__(self, deps: GatewayDeps, *, handle_signals: bool = True, reuse_port: bool = False) -> None:
        settings = self.settings = deps.settings
        self._reuse_port = reuse_port
        """Listen with SO_REUSEPORT: several processes on one port, the kernel spreading connections
        (``gearshift gateway --workers N``)."""
        self.app: FastAPI = create_app(deps)
        config = uvicorn.Config(
            self.app,
            host=settings.host,
            port=settings.port,
            http=guarded_protocol(settings),
            limit_concurrency=settings.max_connections,
            lifespan="on",
            log_level=settings.log_level.lower(),
            access_log=False,
            timeout_graceful_shutdown=5,
            timeout_keep_alive=settings.keep_alive_s,
        )
        self._server = _StandaloneServer(config) if handle_signals else _EmbeddedServer(config)
        self._task: asyncio.Task[None] | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the gateway is not started")
        return f"http://{self.settings.host}:{self.port}"

    @property
    def gateway(self) -> Gateway:
        gw: Gateway = self.app.state.gateway
        return gw

    async def start(self) -> None:
        """Serve in a background task; return once the socket listens and the lifespan has run."""
        sockets = [_reuse_port_socket(self.settings.host, self.settings.port)] if self._reuse_port else None
        self._task = asyncio.create_task(self._server.serve(sockets=sockets), name="gateway-server")
        async with asyncio.timeout(_START_TIMEOUT_S):
            while not self._server.started:
                if self._task.done():
                    self._task.result()
                    raise RuntimeError("the gateway stopped during start-up")
                await asyncio.sleep(0.01)
        self.port = int(self._server.servers[0].sockets[0].getsockname()[1])
        connections = self._server.server_state.connections
        metrics = self.gateway.metrics
        metrics.measure(metrics.open_connections, lambda: float(len(connections)))

    async def wait(self) -> None:
        """Until the server stops (a signal or ``stop``)."""
        if self._task is not None:
            await self._task

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await self._task
            self._task = None

    def describe(self) -> list[str]:
        return [
            f"OpenAI-compatible endpoint: {self.url}/v1",
            f"metrics: {self.url}/metrics   readiness: {self.url}/readyz   admin API: {self.url}/admin/v1",
        ]


def _reuse_port_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def client_snippet(base_url: str, *, model: str, api_key: str) -> str:
    """Ready-to-paste Python that streams a chat completion through the gateway with the ``openai`` client."""
    return "\n".join(
        [
            "from openai import OpenAI",
            "",
            f'client = OpenAI(base_url="{base_url}/v1", api_key="{api_key}")',
            "stream = client.chat.completions.create(",
            f'    model="{model}",',
            '    messages=[{"role": "user", "content": "Hello!"}],',
            "    max_tokens=64,",
            "    stream=True,",
            ")",
            "for chunk in stream:",
            '    print(chunk.choices[0].delta.content or "", end="", flush=True)',
            "print()",
        ]
    )
