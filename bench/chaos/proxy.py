"""A fault-injecting HTTP proxy in front of a real simulated worker: in mode ``ok`` it passes requests through
(streaming), in ``http_500`` it answers 500, in ``garbage`` it answers 200 with bytes that are neither JSON nor
server-sent events, in ``slow`` it passes through with ``delay_s`` seconds added before every chunk. It also
records the headers each request arrived with (for header-leak checks). Shared by the reliability tests and
``gearshift bench chaos``."""

from __future__ import annotations

import asyncio
from enum import StrEnum

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "te", "upgrade"}
GARBAGE = b"\x00\xff<html>not an event stream" * 4


class Mode(StrEnum):
    OK = "ok"
    HTTP_500 = "http_500"
    GARBAGE = "garbage"
    FROZEN = "frozen"
    """``/metrics`` keeps answering the last body it passed through (stale counters); the rest passes."""
    SLOW = "slow"
    """Every chunk of a ``/v1/`` response is held ``delay_s`` seconds before it is passed on."""


class ChaosProxy:
    """Listens on a free loopback port; ``url`` once started."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.mode = Mode.OK
        self.delay_s = 0.0
        """Seconds added before each chunk in ``slow`` mode."""
        self.seen_headers: list[CIMultiDict[str]] = []
        self.bodies: list[bytes] = []
        self.paths: list[str] = []
        """Every request's method and path, in arrival order."""
        self.url = ""
        self.frozen_metrics = b""
        self.extra_response_headers: dict[str, str] = {}
        """Headers added to every passed-through response (to check the gateway does not forward them)."""
        self._session: aiohttp.ClientSession | None = None
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)

    async def start(self) -> ChaosProxy:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.paths.append(f"{request.method} {request.path_qs}")
        if request.path.startswith("/v1/"):
            self.seen_headers.append(CIMultiDict(request.headers))
            self.bodies.append(body)
        if self.mode is Mode.HTTP_500 and request.path != "/health":
            return web.json_response({"error": {"message": "injected", "type": "InternalServerError"}}, status=500)
        if self.mode is Mode.GARBAGE and request.path != "/health":
            return web.Response(body=GARBAGE, content_type="text/event-stream")
        if self.mode is Mode.FROZEN and request.path == "/metrics" and self.frozen_metrics:
            return web.Response(body=self.frozen_metrics, content_type="text/plain")
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with self._session.request(
            request.method, self.target + request.path_qs, data=body, headers=headers
        ) as upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={
                    **{k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP},
                    **self.extra_response_headers,
                },
            )
            kept = []
            slow = self.mode is Mode.SLOW and request.path.startswith("/v1/")
            try:
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    if slow:
                        await asyncio.sleep(self.delay_s)
                    await response.write(chunk)
                    kept.append(chunk)
                if request.path == "/metrics" and self.mode is Mode.OK:
                    self.frozen_metrics = b"".join(kept)
                await response.write_eof()
            except ConnectionResetError:  # the gateway went away (a cancelled stream, its end included): no one to tell
                return response
            return response
