"""The preStop drain of a worker pod (``gearshift worker drain``, ``fleet.drain``) on a real Redis: the worker is
marked draining where the gateways read worker modes, the command waits until the worker's /metrics shows
nothing running or waiting, and the next start clears the mark (a mode move's record is never touched)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from typer.testing import CliRunner

from fleet.clock import ManualClock
from fleet.config import CommonSettings
from fleet.drain import SHUTDOWN_REASON, begin_shutdown_drain, end_shutdown_drain, is_shutdown_drain
from fleet.store.factory import build_store
from fleet.worker_mode import Mode, Phase, WorkerMode, read_modes, write_mode
from gearshift.cli.app import app

pytestmark = pytest.mark.redis


class FakeVllmMetrics:
    """A worker's /metrics on loopback: ``vllm:num_requests_running``/``waiting`` from a real prometheus_client
    registry; each scrape finishes one running request (so a drain sees the count fall)."""

    def __init__(self, running: int, waiting: int = 0) -> None:
        self.registry = CollectorRegistry()
        self.running = Gauge("vllm:num_requests_running", "", ["engine", "model_name"], registry=self.registry)
        self.waiting = Gauge("vllm:num_requests_waiting", "", ["engine", "model_name"], registry=self.registry)
        self.left = running
        self.waiting.labels("0", "m").set(waiting)
        self.scrapes = 0

    def render(self) -> bytes:
        self.running.labels("0", "m").set(self.left)
        self.scrapes += 1
        self.left = max(0, self.left - 1)
        return generate_latest(self.registry)


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, dict[str, FakeVllmMetrics]]]:
    holder: dict[str, FakeVllmMetrics] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = holder["m"].render()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", holder
    finally:
        server.shutdown()
        server.server_close()


def _fleet(tmp_path: Path) -> Path:
    fleet = {
        "models": [{"name": "m"}],
        "workers": [{"id": "w-0", "url": "http://127.0.0.1:1", "model": "m", "drafter": {"k_max": 4}}],
    }
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet))
    return path


async def _drain(tmp_path: Path, redis_url: str, prefix: str, metrics_url: str, drain_s: float) -> tuple[int, str]:
    """The CLI in a thread (it runs its own event loop)."""
    env = {"GEARSHIFT_REDIS_URL": redis_url, "GEARSHIFT_KEY_PREFIX": prefix, "GEARSHIFT_ALLOW_DEV_SECRETS": "1"}
    argv = ["worker", "drain", "--fleet-file", str(_fleet(tmp_path)), "--worker-id", "w-0"]
    argv += ["--timeout", str(drain_s), "--metrics-url", metrics_url]
    result = await asyncio.to_thread(CliRunner().invoke, app, argv, env=env)
    return result.exit_code, result.output


async def test_the_drain_marks_the_worker_waits_for_its_requests_and_the_next_start_clears_it(
    tmp_path: Path, redis_url: str, metrics_server: tuple[str, dict[str, FakeVllmMetrics]]
) -> None:
    url, holder = metrics_server
    holder["m"] = FakeVllmMetrics(running=3)
    prefix = f"drain-{uuid.uuid4().hex[:8]}:"
    store = build_store(CommonSettings(redis_url=redis_url, key_prefix=prefix))
    try:
        started = time.monotonic()
        code, output = await _drain(tmp_path, redis_url, prefix, url, drain_s=30)
        assert code == 0, output
        assert "drained=True" in output
        assert holder["m"].scrapes == 4, "it waited until the worker ran nothing (3, 2, 1, 0)"
        assert time.monotonic() - started < 30
        (mode,) = (await read_modes(store)).values()
        assert is_shutdown_drain(mode)
        assert not mode.routable, "no gateway sends it a new request"
        assert mode.reason == SHUTDOWN_REASON
        assert await end_shutdown_drain(store, "w-0", clock=ManualClock())
        (mode,) = (await read_modes(store)).values()
        assert mode.phase is Phase.SERVING
        assert mode.routable
    finally:
        await store.close()


async def test_a_drain_that_cannot_empty_the_worker_exits_1_and_a_mode_move_is_never_cleared(
    tmp_path: Path, redis_url: str, metrics_server: tuple[str, dict[str, FakeVllmMetrics]]
) -> None:
    url, holder = metrics_server
    holder["m"] = FakeVllmMetrics(running=1000, waiting=5)
    prefix = f"drain-{uuid.uuid4().hex[:8]}:"
    code, output = await _drain(tmp_path, redis_url, prefix, url, drain_s=3)
    assert code == 1, output
    assert "drained=False" in output
    store = build_store(CommonSettings(redis_url=redis_url, key_prefix=prefix))
    try:
        move = WorkerMode(
            worker_id="w-0", mode=Mode.DRAFTER, phase=Phase.DRAINING, target=Mode.DRAFTER_FREE, since=1.0,
            mode_since=1.0, reason="controller: to the drafter-free gear",
        )  # fmt: skip
        await write_mode(store, move)
        assert not await end_shutdown_drain(store, "w-0", clock=ManualClock())
        assert (await read_modes(store))["w-0"] == move
    finally:
        await store.close()


async def test_the_controller_restarts_nothing_for_a_shutdown_drain_and_lets_an_abandoned_one_lapse() -> None:
    """A shutdown drain is no mode move: the leader's gear loop must neither restart the worker (its pod is going
    away by itself) nor fail on the record; one that no new pod clears returns to serving after the drain timeout."""
    from tests.controller.test_ctl_gear_mode import CONFIG, FakeRestarter, fleet, gears, obs

    clock = ManualClock()
    restarter = FakeRestarter(clock)
    g = gears(clock, restarter, fleet())
    await g.tick([obs("w0"), obs("w1", off_pays=False)])  # first sight: both serving with their drafter
    record = await begin_shutdown_drain(g.store, "w0", clock=clock)
    for _ in range(int(CONFIG.drain_timeout_s / 2) + 5):
        clock.advance(2.0)
        await g.tick([obs("w0"), obs("w1", off_pays=False)])
        mode = (await read_modes(g.store))["w0"]
        if mode.phase is not Phase.DRAINING:
            break
        assert restarter.calls == [], "nothing restarted for a pod that is terminating"
    assert restarter.calls == []
    assert mode.phase is Phase.SERVING, "an abandoned shutdown drain lapses"
    assert clock.wall() - record.since > CONFIG.drain_timeout_s
