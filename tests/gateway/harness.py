"""The gateway test harness: a fake vLLM worker (aiohttp on loopback, with failure modes), configs for fake
fleets and tenants, and a real gateway (uvicorn on a free loopback port) served in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import aiohttp
import httpx
import orjson
from aiohttp import web
from opentelemetry.sdk.trace.export import SpanExporter

from fleet.clock import Clock, SystemClock
from fleet.config import FleetConfig, TenantsConfig, key_digest
from fleet.store.memory import MemoryStore
from fleet.store.protocol import Store
from gateway.http.serve import GatewayServer
from gateway.routing.prefix import PrefixIndex
from gateway.routing.router import Router, default_router
from gateway.settings import GatewaySettings
from gateway.upstream.body import BodyRules
from gateway.wiring import Gateway, GatewayDeps


# ------------------------------------------------------------------------------------------- fake worker
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
    """Completion tokens per response, fewer when ``max_tokens`` is lower (like an early EOS)."""
    tokens_per_chunk: int = 1
    """Tokens per stream chunk (vLLM sends one engine step's tokens, up to k + 1, in one chunk)."""
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

    def _chunk(
        self,
        body: dict[str, Any],
        *,
        chat: bool,
        delta: dict[str, Any] | None,
        text: str = "",
        usage: dict[str, int] | None = None,
    ) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": None} if chat else {"index": 0, "text": text}
        obj: dict[str, Any] = {
            "id": "cmpl-fake",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": 0,
            "model": body.get("model"),
            "choices": [choice],
        }
        if usage is not None:
            obj["usage"] = {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    async def _stream(self, request: web.Request, body: dict[str, Any], *, chat: bool, n: int) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        options = body.get("stream_options") or {}
        running = options.get("include_usage") and options.get("continuous_usage_stats")
        try:
            if chat:
                await resp.write(self._chunk(body, chat=True, delta={"role": "assistant", "content": ""}))
            steps = [min(self.tokens_per_chunk, n - sent) for sent in range(0, n, self.tokens_per_chunk)]
            for i, tokens in enumerate(steps):
                if self.mode is Mode.DIE_MID_STREAM and i == self.die_after:
                    return self._drop(request)
                if self.mode is Mode.TRUNCATE and i == self.die_after:
                    await resp.write_eof()
                    return resp
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                done = sum(steps[: i + 1])
                usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": done} if running else None
                text = "tok " * tokens
                await resp.write(self._chunk(body, chat=chat, delta={"content": text}, text=text, usage=usage))
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {
                    "prompt_tokens": self.prompt_tokens,
                    "completion_tokens": n,
                    "total_tokens": self.prompt_tokens + n,
                }
                obj: dict[str, Any] = {
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


# ----------------------------------------------------------------------------------------------- gateway
PEPPER = "test-pepper"
ADMIN_KEY = "test-admin-key"
MODEL = "kimi-k3"
KEYS = {"alpha": "sk-alpha", "beta": "sk-beta", "gamma": "sk-gamma"}
"""Tenant → its API key secret."""


def make_fleet(urls: list[str], *, model: str = MODEL) -> FleetConfig:
    return FleetConfig.model_validate(
        {
            "models": [{"name": model}, {"name": "other-model"}],
            "workers": [{"id": f"w{i}", "url": url, "model": model, "max_num_seqs": 64} for i, url in enumerate(urls)],
        }
    )


def make_tenants(**overrides: dict[str, Any]) -> TenantsConfig:
    """Tenants alpha (interactive), beta (batch) and gamma (may use only ``other-model``); ``overrides``
    replace fields per tenant id (``alpha={"rpm": 2}``)."""
    base: dict[str, dict[str, Any]] = {
        "alpha": {"tier": "interactive", "models": ["*"]},
        "beta": {"tier": "batch", "models": [MODEL]},
        "gamma": {"tier": "interactive", "models": ["other-model"]},
    }
    tenants = [
        {
            "id": tid,
            **fields,
            **overrides.get(tid, {}),
            "keys": [{"id": f"{tid}-1", "digest": key_digest(KEYS[tid], pepper=PEPPER)}],
        }
        for tid, fields in base.items()
    ]
    return TenantsConfig.model_validate(
        {
            "tiers": {
                "interactive": {"priority": 0, "tpot_target_s": 0.05, "speculation": "speed"},
                "batch": {"priority": 10, "speculation": "throughput", "sheddable": True},
            },
            "tenants": tenants,
        }
    )


def body_rules(**overrides: Any) -> BodyRules:
    """The settings' body rules with ``overrides`` (``BodyRules`` field names)."""
    return dataclasses.replace(BodyRules.from_settings(GatewaySettings()), **overrides)


def make_router(fleet: FleetConfig, *, prefix: PrefixIndex | None = None, rng: random.Random | None = None,
                **settings: Any) -> Router:  # fmt: skip
    """The gateway's router for ``fleet`` without placement, with ``settings`` over the defaults; the TTFT
    scorer is left out unless ``weight_ttft`` is given (the unit tests place by the other scorers)."""
    return default_router(GatewaySettings(**{"weight_ttft": 0.0, **settings}), fleet, prefix=prefix, rng=rng)


def make_settings(**overrides: Any) -> GatewaySettings:
    defaults: dict[str, Any] = {
        "key_pepper": PEPPER,
        "admin_key": ADMIN_KEY,
        "port": 0,
        "connect_timeout_s": 1.0,
        "first_byte_timeout_s": 2.0,
        "idle_timeout_s": 2.0,
        "request_timeout_s": 5.0,
        "health_interval_s": 0.5,
        "health_timeout_s": 0.5,
        "state_refresh_s": 0.05,
        "key_cache_ttl_s": 0.2,
        "log_level": "WARNING",
    }
    return GatewaySettings(**{**defaults, **overrides})


@dataclass
class RunningGateway:
    url: str
    gw: Gateway
    store: Store
    server: GatewayServer
    keys: dict[str, str] = field(default_factory=lambda: KEYS)
    """Tenant → its API key secret (the tenants file's)."""
    admin_key: str = ADMIN_KEY

    @property
    def port(self) -> int:
        assert self.server.port is not None
        return self.server.port

    def client(self, tenant: str | None = "alpha", **kwargs: Any) -> httpx.AsyncClient:
        headers = {"authorization": f"Bearer {self.keys[tenant]}"} if tenant else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, **{"timeout": 10.0, **kwargs})

    def session(self, tenant: str | None = "alpha") -> aiohttp.ClientSession:
        """An aiohttp session as ``tenant`` (None: no key)."""
        headers = {"authorization": f"Bearer {self.keys[tenant]}"} if tenant else {}
        return aiohttp.ClientSession(self.url, headers=headers, timeout=aiohttp.ClientTimeout(total=30))

    def admin(self) -> httpx.AsyncClient:
        headers = {"authorization": f"Bearer {self.admin_key}"}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=10.0)


@contextlib.asynccontextmanager
async def serve_gateway(
    fleet: FleetConfig,
    tenants: TenantsConfig,
    *,
    store: Store | None = None,
    clock: Clock | None = None,
    span_exporter: SpanExporter | None = None,
    base: dict[str, Any] | None = None,
    keys: dict[str, str] | None = None,
    seed: int = 7,
    **settings: Any,
) -> AsyncIterator[RunningGateway]:
    """The gateway's own server runner (``gateway.http.serve.GatewayServer``: uvicorn, httptools) on a free loopback
    port, in this event loop. Its settings are ``make_settings``' (or ``base``, with the log level at WARNING)
    overridden by ``settings``; ``keys`` are the tenants' secrets when not ``KEYS``."""
    clock = clock or SystemClock()
    store = store or MemoryStore(clock=clock)
    config = (
        make_settings(**settings) if base is None else GatewaySettings(**{**base, "log_level": "WARNING", **settings})
    )
    server = GatewayServer(
        GatewayDeps(config, store=store, clock=clock, fleet=fleet, tenants=tenants, rng=random.Random(seed),
                    span_exporter=span_exporter),
        handle_signals=False,
    )  # fmt: skip
    await server.start()
    try:
        yield RunningGateway(
            server.url, server.gateway, store, server, keys or KEYS, config.admin_key.get_secret_value()
        )
    finally:
        stopping = asyncio.ensure_future(server.stop())
        done, _ = await asyncio.wait({stopping}, timeout=15)
        if not done:
            raise AssertionError(f"the gateway did not stop within 15 s; its tasks:\n{_task_stacks()}")
        stopping.result()


def _task_stacks() -> str:
    out = io.StringIO()
    for task in asyncio.all_tasks():
        task.print_stack(limit=8, file=out)
    return out.getvalue()


async def eventually(
    check: Callable[[], Awaitable[bool] | bool], *, timeout_s: float = 5.0, every_s: float = 0.02
) -> None:
    """Poll ``check`` (a predicate or a coroutine function) until it is true; fail after ``timeout_s`` seconds."""
    for _ in range(int(timeout_s / every_s) + 1):
        got = check()
        if got if isinstance(got, bool) else await got:
            return
        await asyncio.sleep(every_s)
    raise AssertionError(f"condition not met within {timeout_s} s")
