"""The HTTP side of the plugin on a FastAPI app, with the engine-side logic behind an in-process channel."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, generate_latest

from fleet.clock import ManualClock
from fleet.speculation import SPECULATION_PATH
from workers.vllm.api import STATE_ATTR, SpeculationFront, create_router, poll_forever
from workers.vllm.control import EngineSideMissing, EngineSpeculation, EngineView, Reply
from workers.vllm.spec_metrics import WorkerSpecMetrics

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class InProcessEngine:
    """The engine side in this process; ``calls`` counts round trips, ``fail`` simulates a dead engine."""

    def __init__(self, clock: ManualClock) -> None:
        self.lookup = [0, 4, 4, 4, 4]
        view = EngineView(lookup=self.lookup, k_max=4, max_num_seqs=4, method="ngram")
        self.spec = EngineSpeculation(view, worker_id="w0", clock=clock)
        self.fail: Exception | None = None
        self.calls = 0

    async def __call__(self, request: dict[str, Any]) -> Reply:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return self.spec.handle(request)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def engine(clock: ManualClock) -> InProcessEngine:
    return InProcessEngine(clock)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def front(engine: InProcessEngine, registry: CollectorRegistry) -> SpeculationFront:
    return SpeculationFront(engine, token=TOKEN, metrics=WorkerSpecMetrics(registry))


@pytest.fixture
async def client(front: SpeculationFront) -> AsyncIterator[httpx.AsyncClient]:
    app = FastAPI()
    app.include_router(create_router())
    setattr(app.state, STATE_ATTR, front)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://worker") as c:
        yield c


def metric(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float | None:
    return registry.get_sample_value(name, labels or {})


async def test_get_returns_the_start_up_schedule(client: httpx.AsyncClient) -> None:
    response = await client.get(SPECULATION_PATH)
    assert response.status_code == 200
    body = response.json()
    assert body["schedule"] == [[1, 4, 4]] == body["fallback_schedule"]
    assert set(body) >= {"worker_id", "method", "k_max", "version", "applied_at", "lease_expires_at"}


async def test_put_applies_and_mirrors_into_the_metrics(
    client: httpx.AsyncClient, engine: InProcessEngine, registry: CollectorRegistry
) -> None:
    response = await client.put(SPECULATION_PATH, json={"schedule": [[1, 2, 3], [3, 4, 0]], "version": 7}, headers=AUTH)
    assert response.status_code == 200
    assert engine.lookup == [0, 3, 3, 0, 0]
    assert metric(registry, "gearshift_worker_spec_k", {"from_bs": "1", "to_bs": "2"}) == 3
    assert metric(registry, "gearshift_worker_spec_k", {"from_bs": "3", "to_bs": "4"}) == 0
    assert metric(registry, "gearshift_worker_spec_version") == 7
    await client.put(SPECULATION_PATH, json={"k": 1, "version": 8}, headers=AUTH)
    assert metric(registry, "gearshift_worker_spec_k", {"from_bs": "1", "to_bs": "2"}) is None  # old rows removed
    assert metric(registry, "gearshift_worker_spec_k", {"from_bs": "1", "to_bs": "4"}) == 1


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}])
async def test_put_without_the_control_token_is_401(
    client: httpx.AsyncClient, engine: InProcessEngine, headers: dict[str, str]
) -> None:
    response = await client.put(SPECULATION_PATH, json={"k": 1, "version": 1}, headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "AuthenticationError"
    assert engine.calls == 0


@pytest.mark.parametrize(
    ("body", "needle", "param"),
    [
        (b"{not json", "not valid JSON", None),
        (b'{"k": 9, "version": 1}', "k_max 4", "schedule"),
        (b'{"version": 1, "k": 1, "lease_seconds": -1}', "lease_seconds", "lease_seconds"),
    ],
)
async def test_bad_bodies_are_400_with_a_message(
    client: httpx.AsyncClient, engine: InProcessEngine, body: bytes, needle: str, param: str | None
) -> None:
    response = await client.put(SPECULATION_PATH, content=body, headers=AUTH | {"content-type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert needle in error["message"]
    assert (error["type"], error["param"], error["code"]) == ("BadRequestError", param, 400)
    assert engine.lookup == [0, 4, 4, 4, 4]


async def test_older_version_is_409(client: httpx.AsyncClient) -> None:
    assert (await client.put(SPECULATION_PATH, json={"k": 1, "version": 5}, headers=AUTH)).status_code == 200
    response = await client.put(SPECULATION_PATH, json={"k": 2, "version": 4}, headers=AUTH)
    assert response.status_code == 409
    assert response.json()["error"] == {
        "message": "version: 4 is older than the applied version 5",
        "type": "ConflictError",
        "param": "version",
        "code": 409,
    }


async def test_an_engine_without_the_plugin_method_is_503_with_the_fix(
    client: httpx.AsyncClient, engine: InProcessEngine
) -> None:
    engine.fail = EngineSideMissing("'EngineCoreProc' object has no attribute 'gearshift_speculation'")
    response = await client.get(SPECULATION_PATH)
    assert response.status_code == 503
    assert "VLLM_PLUGINS=gearshift" in response.json()["error"]["message"]
    assert response.json()["error"]["type"] == "ServiceUnavailableError"


async def test_any_other_engine_failure_is_503_naming_it(client: httpx.AsyncClient, engine: InProcessEngine) -> None:
    engine.fail = ConnectionError("engine core died")
    response = await client.get(SPECULATION_PATH)
    assert response.status_code == 503
    assert "engine core died" in response.json()["error"]["message"]


async def test_routes_without_initialised_state_are_503() -> None:
    app = FastAPI()
    app.include_router(create_router())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://worker") as c:
        assert (await c.get(SPECULATION_PATH)).status_code == 503
        assert (await c.put(SPECULATION_PATH, json={"k": 1, "version": 1}, headers=AUTH)).status_code == 503


class GatedClock(ManualClock):
    """A clock whose ``sleep`` advances time, then waits for the test to let it go (one poll per ``tick``)."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps: list[float] = []
        self._gate: asyncio.Queue[None] = asyncio.Queue()

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)
        await self._gate.get()

    async def started(self) -> None:
        await self._until(1)

    async def tick(self) -> None:
        """Let the sleeping poller run one poll and wait until it sleeps again."""
        want = len(self.sleeps) + 1
        self._gate.put_nowait(None)
        await self._until(want)

    async def _until(self, n: int) -> None:
        for _ in range(1000):
            if len(self.sleeps) >= n:
                return
            await asyncio.sleep(0)
        raise AssertionError(f"the poller did not reach sleep #{n}")


async def test_poller_expires_an_idle_lease_and_counts_it(registry: CollectorRegistry) -> None:
    clock = GatedClock()
    engine = InProcessEngine(clock)
    front = SpeculationFront(engine, token=TOKEN, metrics=WorkerSpecMetrics(registry))
    await front.put({"k": 1, "version": 2, "lease_seconds": 2.5})
    task = asyncio.create_task(poll_forever(front, clock=clock, interval_s=1.0))
    try:
        await clock.started()  # read at t = 0, asleep until t = 1 s
        await clock.tick()  # read at t = 1 s: the lease still holds
        await clock.tick()  # read at t = 2 s
        assert engine.lookup == [0, 1, 1, 1, 1]
        assert metric(registry, "gearshift_worker_spec_lease_expired_total") == 0
        await clock.tick()  # read at t = 3 s: expired on the idle engine
        assert engine.lookup == [0, 4, 4, 4, 4]
        assert metric(registry, "gearshift_worker_spec_lease_expired_total") == 1
        assert metric(registry, "gearshift_worker_spec_k", {"from_bs": "1", "to_bs": "4"}) == 4
        assert b"gearshift_worker_spec_lease_expired_total 1.0" in generate_latest(registry)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_poller_backs_off_while_the_engine_is_down(front: SpeculationFront, engine: InProcessEngine) -> None:
    clock = GatedClock()
    engine.fail = ConnectionError("engine gone")
    task = asyncio.create_task(poll_forever(front, clock=clock, interval_s=1.0, max_backoff_s=4.0))
    try:
        await clock.started()  # the first read failed
        for _ in range(4):
            await clock.tick()
        engine.fail = None
        await clock.tick()
        assert clock.sleeps == [2.0, 4.0, 4.0, 4.0, 4.0, 1.0]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_poller_stops_on_an_engine_without_a_table(registry: CollectorRegistry) -> None:
    clock = GatedClock()
    view = EngineView(lookup=None, k_max=4, max_num_seqs=4, method="ngram")
    spec = EngineSpeculation(view, worker_id="w0", clock=clock)

    async def channel(request: dict[str, Any]) -> Reply:
        return spec.handle(request)

    front = SpeculationFront(channel, token=TOKEN, metrics=WorkerSpecMetrics(registry))
    task = asyncio.create_task(poll_forever(front, clock=clock, interval_s=1.0))
    await asyncio.wait_for(task, timeout=5.0)
    assert clock.sleeps == []
