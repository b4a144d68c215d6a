"""``gearshift bench soak``: two gateway replicas on a real Redis in front of simulated workers, N concurrent
streaming clients of several tenants and tiers for a fixed duration, and the invariants that must hold
(``bench.soak.report`` checks and writes them up).

Everything is bounded: the clients stop at the deadline (each request has its own timeout), the sampler
stops with them, and the stack is torn down whatever happens. Times are seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

from bench.soak.client import StreamResult, connection_tracing, stream_chat
from bench.soak.probe import CONNECTIONS_METRIC, TASKS_METRIC, established, open_fds, rss_mib, scrape_gauge
from bench.soak.stack import KEY_PREFIX, MODEL, SOAK_TENANTS, SoakStack, SoakTenant, soak_stack
from fleet.store.protocol import UsageRecord
from fleet.store.redis import RedisStore

WORDS = [
    "gear",
    "shift",
    "speculative",
    "decoding",
    "draft",
    "accept",
    "token",
    "batch",
    "expert",
    "route",
    "tenant",
    "lease",
]


CLIENT_KEEPALIVE_S = 15.0
"""The clients' pool reuses a connection idle at most this long (aiohttp's default, stated): well below the gateway's
keep-alive (``GatewaySettings.keep_alive_s``, 75 s), so the clients close idle connections before the gateway does. A
pooled connection reused just as the server closes it fails with no response (HTTP/1.1's keep-alive race; the soak
does not retry its POSTs), and a client whose loop lags on a loaded machine reuses connections that the server has
seen idle for seconds longer than the client has: against uvicorn's default keep-alive of 5 s that lost requests
(issue 23)."""


@dataclass(frozen=True, slots=True)
class SoakConfig:
    clients: int = 200
    duration_s: float = 600.0
    warmup_s: float = 60.0
    """RSS growth is measured from the first sample after this."""
    sample_s: float = 10.0
    workers: int = 4
    replicas: int = 2
    speedup: float = 1.0
    """Simulated seconds per real second of the workers."""
    min_tokens: int = 16
    max_tokens: int = 128
    request_timeout_s: float = 120.0
    settle_s: float = 3.0
    """Wait after the clients stop before the end-of-run probes."""
    seed: int = 0
    tenants: tuple[SoakTenant, ...] = SOAK_TENANTS


@dataclass(slots=True)
class Finished:
    """A finished request: when (seconds since the start), whose, and what the client saw."""

    at_s: float
    tenant: str
    result: StreamResult
    gateway: int = 0
    """Which gateway replica (index) the request went to."""


@dataclass(slots=True)
class Sample:
    at_s: float
    rss_mib: list[float]
    connections: list[int]
    fds: list[int]
    tasks: list[float | None]
    served: int
    errors: int


@dataclass(slots=True)
class Probe:
    """Per-gateway figures at one moment."""

    connections: list[int]
    fds: list[int]
    tasks: list[float | None]
    exported_connections: list[float | None]


@dataclass
class SoakResult:
    config: SoakConfig
    started_wall: float
    elapsed_s: float = 0.0
    finished: list[Finished] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    before: Probe | None = None
    after: Probe | None = None
    ledger: dict[str, dict[str, float]] = field(default_factory=dict)
    """Tenant → the admin usage report's totals (requests, prompt_tokens, completion_tokens)."""
    records: list[UsageRecord] = field(default_factory=list)
    """Every usage record in the run's Redis (the exact, per-request check reads them)."""
    limited_tenants: frozenset[str] = frozenset()
    gateway_exit_codes: list[int] = field(default_factory=list)
    died: list[str] = field(default_factory=list)
    """Processes of the stack that exited during the run (``name: exit status``); the run stops early then."""
    load: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())
    """The machine's load averages (1, 5, 15 min) when the load started and when it ended."""


def _probe(stack: SoakStack) -> Probe:
    return Probe(
        connections=[established(g.port) for g in stack.gateways],
        fds=[open_fds(g.pid) for g in stack.gateways],
        tasks=[scrape_gauge(g.url, TASKS_METRIC) for g in stack.gateways],
        exported_connections=[scrape_gauge(g.url, CONNECTIONS_METRIC) for g in stack.gateways],
    )


def _body(rng: random.Random, cfg: SoakConfig) -> dict[str, object]:
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60)))
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": rng.randint(cfg.min_tokens, cfg.max_tokens),
        "ignore_eos": True,
    }


async def _client(
    i: int, stack: SoakStack, cfg: SoakConfig, session: aiohttp.ClientSession, deadline: float, t0: float,
    out: list[Finished], abort: asyncio.Event,
) -> None:  # fmt: skip
    rng = random.Random(cfg.seed * 100_003 + i)
    tenants, weights = list(cfg.tenants), [t.weight for t in cfg.tenants]
    while time.monotonic() < deadline and not abort.is_set():
        tenant = rng.choices(tenants, weights)[0]
        key = rng.choice(stack.secrets.keys[tenant.id])
        replica = rng.randrange(len(stack.gateway_urls))
        url = stack.gateway_urls[replica]
        timeout = min(cfg.request_timeout_s, max(deadline - time.monotonic(), 0.0) + cfg.request_timeout_s)
        r = await stream_chat(session, url, key=key, body=_body(rng, cfg), timeout_s=timeout)
        out.append(Finished(at_s=r.ended - t0, tenant=tenant.id, result=r, gateway=replica))
        if r.transport_error is not None:  # never spin on a broken connection
            await asyncio.sleep(0.1)
        if r.status == 429:  # back off as told, but never past the deadline
            retry = float(r.headers.get("retry-after", "1") or 1)
            await asyncio.sleep(min(retry, 2.0, max(deadline - time.monotonic(), 0.0)))


async def _sampler(
    stack: SoakStack, cfg: SoakConfig, t0: float, result: SoakResult, stop: asyncio.Event,
    progress: Callable[[Sample], None], abort: asyncio.Event,
) -> None:  # fmt: skip
    while not stop.is_set():
        result.died = [f"{p.name}: exit status {p.popen.returncode}" for p in stack.processes if not p.alive()]
        if result.died:
            abort.set()
            return
        probe = await asyncio.to_thread(_probe, stack)
        done = result.finished
        sample = Sample(
            at_s=time.monotonic() - t0,
            rss_mib=[rss_mib(g.pid) for g in stack.gateways],
            connections=probe.connections,
            fds=probe.fds,
            tasks=probe.tasks,
            served=sum(1 for f in done if f.result.ok),
            errors=sum(1 for f in done if not f.result.ok),
        )
        result.samples.append(sample)
        progress(sample)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=cfg.sample_s)


async def _ledger(stack: SoakStack, since: float, tenants: tuple[SoakTenant, ...]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    headers = {"authorization": f"Bearer {stack.secrets.admin_key}"}
    async with aiohttp.ClientSession(headers=headers) as s:
        for t in tenants:
            url = f"{stack.gateway_urls[0]}/admin/v1/usage/{t.id}"
            async with s.get(url, params={"since": repr(since), "limit": "0"}) as resp:
                body = orjson.loads(await resp.read())
            out[t.id] = {k: float(body.get(k, 0)) for k in ("requests", "prompt_tokens", "completion_tokens")}
    return out


async def _records(stack: SoakStack, *, at_most: int) -> list[UsageRecord]:
    store = RedisStore.from_url(stack.redis.url, prefix=KEY_PREFIX)
    try:
        return await store.ledger(since=0.0, until=1e12, limit=at_most)
    finally:
        await store.close()


async def run_soak(
    cfg: SoakConfig, run_dir: Path, *, progress: Callable[[Sample], None] = lambda _: None
) -> SoakResult:
    """Start the stack, drive it for ``cfg.duration_s``, probe it before and after, and stop it."""
    with soak_stack(run_dir, workers=cfg.workers, replicas=cfg.replicas, speedup=cfg.speedup,
                    tenants=cfg.tenants) as stack:  # fmt: skip
        result = SoakResult(
            config=cfg,
            started_wall=time.time() - 1.0,
            limited_tenants=frozenset(t.id for t in cfg.tenants if t.limited),
        )
        result.before = await asyncio.to_thread(_probe, stack)
        load_start = os.getloadavg()
        t0 = time.monotonic()
        deadline = t0 + cfg.duration_s
        stop, abort = asyncio.Event(), asyncio.Event()
        sampler = asyncio.create_task(_sampler(stack, cfg, t0, result, stop, progress, abort))
        connector = aiohttp.TCPConnector(limit=0, force_close=False, keepalive_timeout=CLIENT_KEEPALIVE_S)
        async with aiohttp.ClientSession(connector=connector, trace_configs=[connection_tracing()]) as session:
            await asyncio.gather(*(_client(i, stack, cfg, session, deadline, t0, result.finished, abort)
                                   for i in range(cfg.clients)))  # fmt: skip
        result.elapsed_s = time.monotonic() - t0
        result.load = (load_start, os.getloadavg())
        stop.set()
        await sampler
        await asyncio.sleep(cfg.settle_s)
        result.after = await asyncio.to_thread(_probe, stack)
        if not result.died:  # a dead gateway cannot be asked; the report says why the run stopped
            result.ledger = await _ledger(stack, result.started_wall, cfg.tenants)
            result.records = await _records(stack, at_most=2 * len(result.finished) + 1000)
        result.gateway_exit_codes = [await asyncio.to_thread(g.terminate) for g in stack.gateways]
    return result
