"""Prefix affinity on real vLLM: the gateway in front of two CPU workers started with ``--enable-prefix-caching``
sends each multi-turn session's turns to the worker that holds its prefix, which raises the workers' own
``vllm:prefix_cache_hits`` against the same traffic routed without affinity; the cached tokens the workers
report (``prompt_tokens_details.cached_tokens``) reach the ledger.

Each arm runs its own sessions (distinct beginnings), one request at a time, so the only difference is routing:
without affinity the router's scores tie and the seeded tie-break spreads the turns; with it they follow the
prefix (the load bound never bites at one request in flight)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.procs import free_port
from fleet.clock import SystemClock
from fleet.config import FleetConfig, TenantsConfig, WorkerConfig, key_digest
from fleet.store.memory import MemoryStore
from gateway.http.serve import GatewayServer
from gateway.settings import GatewaySettings
from gateway.wiring import GatewayDeps
from workers.vllm.cpu_server import ServerSpec, ServerStartError, running_servers, tiny_plan, tiny_worker
from workers.vllm.launcher import CpuOptions

from .conftest import CONTROL_TOKEN

pytestmark = [pytest.mark.vllm, pytest.mark.heavy, pytest.mark.timeout(900)]
"""Heavy: two more vLLM start-ups, side by side (about 25 s on 2 idle cores, minutes at load 8+: the limit covers
the fixture's setup); ``scripts/heavy-tests.sh`` runs it."""

API_KEY = "gs-prefix-test-key"
PEPPER = "prefix-test-pepper"
SESSIONS = 6
TURNS = 3
CPU_PREFIX_ARGS = ("--enable-prefix-caching", "--block-size", "32")
"""vLLM's CPU backend defaults to 128-token blocks; 32 gives the tiny model's short prompts several."""


HEAVY_READY_TIMEOUT_S = 600.0
"""A vLLM start on the loaded 2-core machine, as the other heavy fixtures allow (one start takes 20-30 s idle; two
side by side on 2 cores took over the 150 s a start was once allowed at load 8)."""


@pytest.fixture(scope="module")
def workers(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerConfig]]:
    """Two CPU vLLM workers with prefix caching, started together: a start is mostly two single-threaded Python
    imports (the API server's, then its EngineCore's), so two side by side on 2 cores take about one's time. Both
    ports are taken just before the servers start (another process on the host may take a port chosen earlier)."""
    configs = [
        tiny_worker(port=free_port(), model_dir=tiny_model_dir, worker_id=f"tiny-{i}").model_copy(
            update={"extra_args": CPU_PREFIX_ARGS}
        )
        for i in range(2)
    ]
    env = {"GEARSHIFT_CONTROL_TOKEN": CONTROL_TOKEN, "GEARSHIFT_SPEC_POLL_SECONDS": "0.25"}
    specs = {
        c.id: ServerSpec(
            tiny_plan(c, cpu=CpuOptions(in_process_worker=True)), c.url,
            tmp_path_factory.mktemp(f"vllm-prefix-{i}") / "vllm.log", env,
        )
        for i, c in enumerate(configs)
    }  # fmt: skip
    try:
        with running_servers(specs, ready_timeout_s=HEAVY_READY_TIMEOUT_S):
            yield configs
    except ServerStartError as exc:
        pytest.fail(str(exc), pytrace=False)


def _hits(text: str) -> float:
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "vllm:prefix_cache_hits_total"
    )


async def _fleet_hits(http: httpx.AsyncClient, workers: list[WorkerConfig]) -> float:
    return sum([_hits((await http.get(f"{w.url}/metrics")).text) for w in workers])


async def _run_arm(workers: list[WorkerConfig], *, arm: str, weight_prefix: float) -> tuple[float, int, int]:
    """Sessions through a gateway; (the workers' prefix-cache hits gained, cached tokens in the usages, cached
    tokens in the ledger)."""
    fleet = FleetConfig.model_validate(
        {"models": [{"name": "tiny", "context_window": 1024}], "workers": [w.model_dump(mode="json") for w in workers]}
    )
    tenants = TenantsConfig.model_validate({
        "tiers": {"agents": {"priority": 0}},
        "tenants": [{"id": "t", "tier": "agents", "keys": [{"id": "k", "digest": key_digest(API_KEY, pepper=PEPPER)}]}],
    })  # fmt: skip
    settings = GatewaySettings(
        key_pepper=PEPPER, port=0, weight_prefix=weight_prefix, prefix_block_chars=64, health_interval_s=0.5,
        health_timeout_s=0.5, log_level="WARNING",
    )  # fmt: skip
    clock = SystemClock()
    store = MemoryStore(clock=clock)
    server = GatewayServer(
        GatewayDeps(settings, store=store, clock=clock, fleet=fleet, tenants=tenants, rng=random.Random(0)),
        handle_signals=False,
    )
    await server.start()
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            before = await _fleet_hits(http, workers)
            headers = {"authorization": f"Bearer {API_KEY}"}
            reported = 0
            for i in range(SESSIONS):
                reported += await _session(http, f"{server.url}/v1/chat/completions", headers, f"{arm}-{i}")
            await server.gateway.ledger.idle()
            ledger = sum(r.cached_tokens for r in await store.ledger(since=0.0, until=1e12))
            return await _fleet_hits(http, workers) - before, reported, ledger
    finally:
        await server.stop()


async def _session(http: httpx.AsyncClient, url: str, headers: dict[str, str], name: str) -> int:
    """One session of ``TURNS`` turns, each sent after the previous answer; the cached tokens its usages report."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"Session {name}. You are a terse agent; answer in a few words. " * 3}
    ]
    cached = 0
    for turn in range(TURNS):
        messages.append({"role": "user", "content": f"Turn {turn}: next step, please."})
        body = {"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        response = await http.post(url, json=body, headers=headers)
        assert response.status_code == 200, response.text
        payload = response.json()
        cached += int((payload["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        messages.append({"role": "assistant", "content": payload["choices"][0]["message"]["content"]})
    return cached


async def test_affinity_raises_the_workers_prefix_cache_hits(workers: list[WorkerConfig]) -> None:
    hits_off, reported_off, ledger_off = await _run_arm(workers, arm="off", weight_prefix=0.0)
    hits_on, reported_on, ledger_on = await _run_arm(workers, arm="on", weight_prefix=2.0)
    assert hits_on > hits_off, (hits_on, hits_off)
    assert (reported_on, reported_off) == (hits_on, hits_off)  # the usage blocks tell what the counters count
    assert (ledger_on, ledger_off) == (reported_on, reported_off)  # and the gateway meters it
