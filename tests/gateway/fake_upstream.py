"""A tiny, fast fake of a vLLM worker's OpenAI API (aiohttp on loopback), with failure modes for tests.

Gateway-independent: it knows only the OpenAI wire format. Each instance records the bodies it received
and how many streams the client abandoned.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson
from aiohttp import web


class Mode(StrEnum):
    OK = "ok"
    DROP = "drop"
    """Close the connection before sending anything."""
    HTTP_500 = "http_500"
    DIE_MID_STREAM = "die_mid_stream"
    """Stream ``die_after`` chunks, then drop the connection."""
    HANG = "hang"
    """Accept the request and never answer."""
    GARBAGE = "garbage"
    """Answer 200 with a body that is not JSON / not SSE."""
    TRUNCATE = "truncate"
    """Stream some chunks, then end the body cleanly without ``[DONE]``."""


@dataclass
class FakeUpstream:
    mode: Mode = Mode.OK
    chunks: int = 8
    """Completion tokens per response (one per chunk), fewer when ``max_tokens`` is lower (like an early EOS)."""
    delay_s: float = 0.0
    """Pause between stream chunks, seconds."""
    die_after: int = 2
    healthy: bool = True
    prompt_tokens: int = 7
    bodies: list[dict[str, Any]] = field(default_factory=list)
    abandoned: int = 0
    """Streams the client closed before the end."""
    abandoned_event: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> FakeUpstream:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --------------------------------------------------------------------------------------------- handlers
    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.bodies.append(body)
        chat = request.path.endswith("/chat/completions")
        n = min(int(body.get("max_tokens") or body.get("max_completion_tokens") or self.chunks), self.chunks)
        if self.mode is Mode.DROP:
            return self._drop(request)
        if self.mode is Mode.HTTP_500:
            return web.json_response(
                {"error": {"message": "engine crashed", "type": "InternalServerError"}}, status=500
            )
        if self.mode is Mode.HANG:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self._abandon()
                raise
        if self.mode is Mode.GARBAGE:
            return web.Response(body=b"<html>not json", content_type="text/html")
        if body.get("stream"):
            return await self._stream(request, body, chat=chat, n=n)
        return web.json_response(self._whole(body, chat=chat, n=n))

    def _drop(self, request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.abort()
        return web.Response()

    def _whole(self, body: dict[str, Any], *, chat: bool, n: int) -> dict[str, Any]:
        text = "tok " * n
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
            if chat
            else {"index": 0, "text": text, "finish_reason": "length"}
        )
        return {
            "id": "cmpl-fake",
            "object": "chat.completion" if chat else "text_completion",
            "created": 0,
            "model": body.get("model"),
            "choices": [choice],
            "usage": {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": n,
                "total_tokens": self.prompt_tokens + n,
            },
        }

    def _chunk(self, body: dict[str, Any], *, chat: bool, delta: dict[str, Any] | None, text: str = "") -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": None} if chat else {"index": 0, "text": text}
        obj = {
            "id": "cmpl-fake",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": 0,
            "model": body.get("model"),
            "choices": [choice],
        }
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    async def _stream(self, request: web.Request, body: dict[str, Any], *, chat: bool, n: int) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        try:
            if chat:
                await resp.write(self._chunk(body, chat=True, delta={"role": "assistant", "content": ""}))
            for i in range(n):
                if self.mode is Mode.DIE_MID_STREAM and i == self.die_after:
                    return self._drop(request)
                if self.mode is Mode.TRUNCATE and i == self.die_after:
                    await resp.write_eof()
                    return resp
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                await resp.write(self._chunk(body, chat=chat, delta={"content": "tok "}, text="tok "))
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {
                    "prompt_tokens": self.prompt_tokens,
                    "completion_tokens": n,
                    "total_tokens": self.prompt_tokens + n,
                }
                obj = {
                    "id": "cmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": body.get("model"),
                    "choices": [],
                    "usage": usage,
                }
                await resp.write(b"data: " + orjson.dumps(obj) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionResetError):
            self._abandon()
            raise
        return resp

    def _abandon(self) -> None:
        self.abandoned += 1
        self.abandoned_event.set()


StartUpstreams = Callable[..., Awaitable[list[FakeUpstream]]]
"""The ``upstreams`` fixture: starts fake workers on loopback and returns them."""
