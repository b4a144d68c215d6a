"""Gateway + controller + a real vLLM CPU worker, in-process on loopback around the session's vLLM server.

The controller is the real one (scrape source, estimator, policy, stabiliser, HTTP actuator) with a short
tick and lease. Its decision is made certain by configuration, not by mocking: the fleet's model points to a
profile whose drafter costs one second per draft position, and the policy may move only to the k tier 2, so
k = 2 beats the start-up k = 4 at any acceptance (goodput ∝ AL(k)/k and AL(4) < 2·AL(2)). Requests stream
through the gateway with the official ``openai`` client; vLLM's own counters show what k the engine ran.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from openai import AsyncOpenAI

from controller.app import ControllerComponent
from controller.policy import PolicyConfig
from controller.settings import ControllerSettings
from controller.stabiliser import StabiliserConfig
from fleet.clock import SystemClock
from fleet.config import FleetConfig, TenantsConfig, WorkerConfig, key_digest
from fleet.perf import load_profile
from fleet.scrape import WorkerScrape
from fleet.speculation import SPECULATION_PATH
from fleet.store.memory import MemoryStore
from gateway.http.serve import GatewayServer
from gateway.settings import GatewaySettings
from gateway.wiring import GatewayDeps
from workers.vllm.cpu_server import TINY_K_MAX, TINY_MAX_NUM_SEQS, RunningServer, tiny_worker
from workers.vllm.measure import read_counters

from .conftest import CONTROL_TOKEN

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

API_KEY = "gs-stack-test-key"
PEPPER = "stack-test-pepper"
CONTROLLER_K = 2
STREAMS = 4
MAX_TOKENS = 48
DECISION_WAIT_S = 30.0
EXPIRY_WAIT_S = 15.0
START_UP = [[1, TINY_MAX_NUM_SEQS, TINY_K_MAX]]


@dataclass
class Stack:
    worker: RunningServer
    worker_id: str
    gateway: GatewayServer
    controller: ControllerComponent
    http: httpx.AsyncClient
    """Talks to the worker directly (its control API and /metrics)."""
    openai: AsyncOpenAI
    """Talks to the gateway."""


def write_config(tmp_path: Path, worker: WorkerConfig) -> dict[str, Path]:
    """Fleet (the worker, its model on a costly-drafter profile) and tenants files in ``tmp_path``."""
    kimi = load_profile("kimi-k3-dspark-tp16")
    drafter = kimi.drafter.model_copy(
        update={"k_max": TINY_K_MAX, "fixed_s": 0.0, "per_seq_s": 0.0, "per_position_s": 1.0}
    )
    profile = kimi.model_copy(update={"name": "costly-drafter", "drafter": drafter})
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump(profile.model_dump(mode="json")))
    fleet = {
        "models": [{"name": "tiny", "profile": str(tmp_path / "profile.yaml"), "context_window": 1024}],
        "workers": [worker.model_dump(mode="json")],
    }
    tenants = {
        "tiers": {"bulk": {"priority": 0}},  # no TPOT target: the policy maximises goodput
        "tenants": [
            {"id": "stack", "tier": "bulk", "keys": [{"id": "k1", "digest": key_digest(API_KEY, pepper=PEPPER)}]}
        ],
    }
    files = {"fleet_file": tmp_path / "fleet.yaml", "tenants_file": tmp_path / "tenants.yaml"}
    files["fleet_file"].write_text(yaml.safe_dump(fleet))
    files["tenants_file"].write_text(yaml.safe_dump(tenants))
    return files


@pytest.fixture
async def stack(vllm_server: RunningServer, tiny_model_dir: Path, tmp_path: Path) -> AsyncIterator[Stack]:
    worker = tiny_worker(port=int(vllm_server.url.rsplit(":", 1)[1]), model_dir=tiny_model_dir)
    files = write_config(tmp_path, worker)
    fleet = FleetConfig.model_validate(yaml.safe_load(files["fleet_file"].read_text()))
    tenants = TenantsConfig.model_validate(yaml.safe_load(files["tenants_file"].read_text()))
    common: dict[str, Any] = {**files, "key_pepper": PEPPER, "control_token": CONTROL_TOKEN}
    clock = SystemClock()
    store = MemoryStore(clock=clock)
    gateway = GatewayServer(
        GatewayDeps(
            GatewaySettings(**common, port=0, state_refresh_s=0.1, health_interval_s=0.5, health_timeout_s=0.5),
            store=store, clock=clock, fleet=fleet, tenants=tenants,
        ),
        handle_signals=False,
    )  # fmt: skip
    controller = ControllerComponent(
        ControllerSettings(
            **common, tick_s=0.5, schedule_lease_s=2.0, leader_lease_s=2.0, state_ttl_s=2.0, metrics_port=0,
            policy=PolicyConfig(k_tiers=(CONTROLLER_K,)),
            stabiliser=StabiliserConfig(
                min_dwell_s=0.0, down_ticks=1, up_ticks=1, probe_interval_s=3600.0, probe_s=1.0
            ),
        ),
        store=store, clock=clock,
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=vllm_server.url, timeout=30.0) as http:
        await reset_to_start_up(http)
        await gateway.start()
        client = AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, max_retries=0, timeout=60.0)
        try:
            yield Stack(vllm_server, worker.id, gateway, controller, http, client)
        finally:
            await client.close()
            await controller.stop()
            await gateway.stop()


async def state(http: httpx.AsyncClient) -> dict[str, object]:
    response = await http.get(SPECULATION_PATH)
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body


async def wait_for(
    http: httpx.AsyncClient, done: Callable[[dict[str, object]], bool], timeout_s: float, what: str
) -> dict[str, object]:
    """Poll the worker's control API until ``done(state)``; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        body = await state(http)
        if done(body):
            return body
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s; worker state: {body}"
        await asyncio.sleep(0.1)


async def reset_to_start_up(http: httpx.AsyncClient) -> None:
    """Whatever earlier tests left: a start-up-schedule PUT with a short lease, then wait for it to lapse."""
    version = int(str((await state(http))["version"])) + 1
    body = {"schedule": START_UP, "version": version, "lease_seconds": 0.5, "reason": "stack test: reset"}
    response = await http.put(SPECULATION_PATH, json=body, headers={"Authorization": f"Bearer {CONTROL_TOKEN}"})
    assert response.status_code == 200, response.text
    await wait_for(http, lambda s: s["lease_expires_at"] is None, EXPIRY_WAIT_S, "the reset lease did not lapse")


async def stream_one(client: AsyncOpenAI, i: int) -> int:
    """One streamed completion through the gateway; returns its completion tokens (from the usage chunk)."""
    stream = await client.completions.create(
        model="tiny", prompt=f"stream {i} through the gateway", max_tokens=MAX_TOKENS, temperature=0.0,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    text, usage = "", None
    async for chunk in stream:
        text += "".join(c.text for c in chunk.choices)
        usage = chunk.usage or usage
    assert text, "the stream carried no text"
    assert usage is not None, "the stream carried no usage chunk"
    return usage.completion_tokens


async def batch_through_gateway(s: Stack) -> WorkerScrape:
    """STREAMS concurrent streams through the gateway; vLLM's counter changes over the batch."""
    before = await read_counters(s.http, s.worker.url)
    tokens = await asyncio.gather(*(stream_one(s.openai, i) for i in range(STREAMS)))
    assert tokens == [MAX_TOKENS] * STREAMS
    return await read_counters(s.http, s.worker.url) - before


async def traffic_until(s: Stack, stop: asyncio.Event) -> int:
    """Batches through the gateway until ``stop`` (each bounded by the client's timeout); returns the count."""
    batches = 0
    while not stop.is_set():
        await batch_through_gateway(s)
        batches += 1
    return batches


def assert_drafts_bounded_by(counters: WorkerScrape, k: int) -> None:
    assert counters.drafts > 0, counters
    assert counters.draft_tokens <= k * counters.drafts, counters
    assert counters.longest_accepted_position == k - 1, counters


async def test_the_controllers_k_reaches_the_engine_and_lapses_when_it_stops(stack: Stack) -> None:
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    assert_drafts_bounded_by(await batch_through_gateway(stack), TINY_K_MAX)  # the start-up k, via the gateway

    await stack.controller.start()
    stop = asyncio.Event()
    traffic = asyncio.create_task(traffic_until(stack, stop))
    try:
        applied = await wait_for(
            stack.http,
            lambda b: b["schedule"] == [[1, TINY_MAX_NUM_SEQS, CONTROLLER_K]],
            DECISION_WAIT_S,
            f"the controller did not apply k={CONTROLLER_K}",
        )
    finally:
        stop.set()
        assert await traffic > 0
    timings["decision_s"] = time.monotonic() - t0

    assert stack.controller.controller is not None
    runtime = stack.controller.controller.workers[stack.worker_id]
    assert applied["version"] == runtime.version
    assert applied["lease_expires_at"] is not None
    assert runtime.k_applied == CONTROLLER_K
    # A bad schedule sent while streams run through the gateway: 400, and the streams finish at k=2.
    bad = {"k": TINY_K_MAX + 1, "version": int(str(applied["version"])) + 1, "lease_seconds": 5.0}
    put_bad = stack.http.put(SPECULATION_PATH, json=bad, headers={"Authorization": f"Bearer {CONTROL_TOKEN}"})
    at_k, refused = await asyncio.gather(batch_through_gateway(stack), put_bad)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "schedule"
    assert (await state(stack.http))["version"] == applied["version"]
    assert_drafts_bounded_by(at_k, CONTROLLER_K)
    assert at_k.accepted_per_pos[CONTROLLER_K:] == (0.0,) * (TINY_K_MAX - CONTROLLER_K)

    t1 = time.monotonic()
    await stack.controller.stop()
    lapsed = await wait_for(
        stack.http,
        lambda b: b["schedule"] == START_UP and b["lease_expires_at"] is None,
        EXPIRY_WAIT_S,
        "the controller's lease did not lapse to the start-up schedule",
    )
    timings["expiry_s"] = time.monotonic() - t1
    assert "lease expired" in str(lapsed["reason"])
    assert_drafts_bounded_by(await batch_through_gateway(stack), TINY_K_MAX)
    print(f"stack timings: {timings}, total {time.monotonic() - t0:.1f} s")
