"""``gearshift bench overload``: TTFT per tier under overload, with and without the gateway's overload control
(``gateway.intake.overload``) → ``docs/benchmarks/overload.md``.

A real gateway (``GatewayServer`` on loopback, in this process) sends streams to one ``SlotWorker``: an aiohttp
fake of a vLLM engine with ``slots`` batch slots and first-come-first-served scheduling (vLLM's default
``--scheduling-policy fcfs``): a request waits for a free slot, prefills for ``prefill_s``, then streams
``tokens`` tokens ``tpot_s`` apart. Its capacity is ``slots / (prefill_s + tokens · tpot_s)`` requests per
second. Two tenants send Poisson traffic, half each, at ``overload`` × that capacity for ``duration_s``:
``chat`` in the ``interactive`` tier (priority 0, TTFT target 1 s, not sheddable) and ``bulk`` in ``batch``
(priority 10, TTFT target 2 s, sheddable). TTFT is measured at the client: from sending the request to the
first content chunk. Time is real (no virtual clock): figures vary a little from run to run.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
from aiohttp import web

from bench.markdown import fmt, table
from fleet.clock import Clock, SystemClock
from fleet.config import FleetConfig, TenantsConfig, key_digest
from fleet.stats import percentile
from fleet.store.memory import MemoryStore
from gateway.http.serve import GatewayServer
from gateway.settings import GatewaySettings
from gateway.wiring import GatewayDeps

MODEL = "kimi-k3"
PEPPER = "bench-overload-pepper"
TIERS = {"interactive": ("chat", "sk-bench-chat", 1.0), "batch": ("bulk", "sk-bench-bulk", 2.0)}
"""Tier → (tenant, API key, TTFT target in seconds)."""


@dataclass(frozen=True)
class OverloadBenchConfig:
    duration_s: float = 30.0
    """Seconds of arrivals per run."""
    overload: float = 1.5
    """Offered load as a multiple of the worker's capacity."""
    slots: int = 4
    prefill_s: float = 0.1
    tokens: int = 4
    tpot_s: float = 0.025
    """Few, slow tokens: the fake engine, not the one event loop shared by it, the gateway and the clients, must
    be the bottleneck."""
    seed: int = 1

    @property
    def capacity_rps(self) -> float:
        """Requests per second the worker completes when busy."""
        return self.slots / (self.prefill_s + self.tokens * self.tpot_s)


class SlotWorker:
    """A fake engine: ``slots`` concurrent requests, the rest waiting first come first served."""

    def __init__(self, config: OverloadBenchConfig) -> None:
        self._config = config
        self._slots = asyncio.Semaphore(config.slots)
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        c = self._config
        async with self._slots:
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            await asyncio.sleep(c.prefill_s)
            for _ in range(c.tokens):
                chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "t"}}]}
                await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
                await asyncio.sleep(c.tpot_s)
            usage = {"prompt_tokens": 8, "completion_tokens": c.tokens, "total_tokens": 8 + c.tokens}
            await resp.write(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\ndata: [DONE]\n\n")
            await resp.write_eof()
        return resp


@dataclass
class TierResult:
    sent: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    ttfts: list[float] = field(default_factory=list)
    """Seconds, of answered (200) requests."""

    def row(self, label: str, tier: str, target_s: float) -> list[object]:
        ok = self.statuses[200]
        met = sum(t <= target_s for t in self.ttfts)
        return [
            label, tier, self.sent, ok, self.statuses[429], self.statuses[503],
            sum(n for s, n in self.statuses.items() if s not in (200, 429, 503)),
            fmt(percentile(self.ttfts, 0.5)), fmt(percentile(self.ttfts, 0.99)), f"{met / max(1, self.sent):.0%}",
        ]  # fmt: skip


def _fleet(url: str, slots: int) -> FleetConfig:
    return FleetConfig.model_validate(
        {"models": [{"name": MODEL}], "workers": [{"id": "w0", "url": url, "model": MODEL, "max_num_seqs": slots}]}
    )


def _tenants() -> TenantsConfig:
    return TenantsConfig.model_validate(
        {
            "tiers": {
                "interactive": {"priority": 0, "ttft_target_s": TIERS["interactive"][2]},
                "batch": {"priority": 10, "ttft_target_s": TIERS["batch"][2], "sheddable": True},
            },
            "tenants": [
                {"id": tenant, "tier": tier, "keys": [{"id": f"{tenant}-1", "digest": key_digest(key, pepper=PEPPER)}]}
                for tier, (tenant, key, _) in TIERS.items()
            ],
        }
    )


async def _one(client: httpx.AsyncClient, key: str, result: TierResult, clock: Clock) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64, "stream": True}
    start = clock.monotonic()
    headers = {"authorization": f"Bearer {key}"}
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as resp:
            first: float | None = None
            async for chunk in resp.aiter_bytes():
                if first is None and b'"content"' in chunk:
                    first = clock.monotonic() - start
            result.statuses[resp.status_code] += 1
            if resp.status_code == 200 and first is not None:
                result.ttfts.append(first)
    except httpx.HTTPError:
        result.statuses[0] += 1


async def run_once(config: OverloadBenchConfig, *, control: bool, clock: Clock) -> dict[str, TierResult]:
    """One run: the worker, a gateway with overload control on or off, and ``duration_s`` of arrivals."""
    worker = SlotWorker(config)
    await worker.start()
    settings = GatewaySettings(
        key_pepper=PEPPER, port=0, overload_control=control, first_byte_timeout_s=600, request_timeout_s=600,
        brownout_auto=False, log_level="WARNING",
    )  # fmt: skip
    server = GatewayServer(
        GatewayDeps(settings, store=MemoryStore(clock=clock), clock=clock, fleet=_fleet(worker.url, config.slots),
                    tenants=_tenants(), rng=random.Random(config.seed)),
        handle_signals=False,
    )  # fmt: skip
    await server.start()
    results = {tier: TierResult() for tier in TIERS}
    rng = random.Random(config.seed)
    rate = config.overload * config.capacity_rps
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=1000)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=600, limits=limits) as client:
            tasks: list[asyncio.Task[None]] = []
            start = clock.monotonic()
            at = 0.0
            for _ in range(int(rate * config.duration_s * 2) + 1):  # bounded: the arrivals of duration_s
                at += rng.expovariate(rate)
                if at >= config.duration_s:
                    break
                await clock.sleep(max(0.0, start + at - clock.monotonic()))
                tier = "interactive" if rng.random() < 0.5 else "batch"
                results[tier].sent += 1
                tasks.append(asyncio.create_task(_one(client, TIERS[tier][1], results[tier], clock)))
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=config.duration_s * config.overload * 4 + 60)
    finally:
        await server.stop()
        await worker.stop()
    return results


def report(config: OverloadBenchConfig, runs: dict[str, dict[str, TierResult]], *, command: str) -> str:
    header = ["overload control", "tier", "sent", "200", "429", "503", "other", "TTFT p50 s", "TTFT p99 s",
              "within target"]  # fmt: skip
    rows = [
        result.row(label, tier, TIERS[tier][2]) for label, by_tier in runs.items() for tier, result in by_tier.items()
    ]
    return "\n".join(
        [
            "# Overload control: TTFT per tier under overload",
            "",
            f"Command: `{command}`",
            "",
            f"One fake engine with {config.slots} slots, first come first served, {config.prefill_s * 1000:.0f} ms "
            f"prefill and {config.tokens} tokens {config.tpot_s * 1000:.0f} ms apart: capacity "
            f"{config.capacity_rps:.1f} requests/s. Poisson arrivals at {config.overload}× capacity "
            f"({config.overload * config.capacity_rps:.1f} requests/s) for {config.duration_s:.0f} s, half "
            f"`interactive` (priority 0, TTFT target {TIERS['interactive'][2]} s, not sheddable), half `batch` "
            f"(priority 10, TTFT target {TIERS['batch'][2]} s, sheddable). TTFT at the client, of answered requests; "
            "'within target' is answered within the tier's TTFT target as a share of those sent. "
            "Method: `bench/overload.py`.",
            "",
            table(header, rows),
            "",
            "Without overload control every request joins the engine's queue, which grows for the whole run, so "
            "both tiers' TTFT grows with it. With it the gateway holds requests while the engine has no free "
            "slot, serves the interactive band first, and refuses batch requests (429 `overload`) whose wait "
            "would break their target. A queued request is dispatched at the latest at its target, so an "
            "answered batch request's TTFT can pass the target by one prefill.",
            "",
        ]
    )


async def run(config: OverloadBenchConfig, *, clock: Clock | None = None) -> dict[str, dict[str, TierResult]]:
    clock = clock or SystemClock()
    return {
        "off": await run_once(config, control=False, clock=clock),
        "on": await run_once(config, control=True, clock=clock),
    }


def write(config: OverloadBenchConfig, out: Path, *, command: str) -> Path:
    """Run both configurations and write ``out/overload.md``; returns its path."""
    runs = asyncio.run(run(config))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "overload.md"
    path.write_text(report(config, runs, command=command))
    return path
