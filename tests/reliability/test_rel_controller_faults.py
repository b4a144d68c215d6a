"""``gearshift controller`` processes under faults: the leader SIGKILLed (a standby takes over and keeps the
worker's schedule lease alive), every controller gone (the worker's lease runs out and it returns to its
start-up schedule), and garbage or frozen worker metrics (the controller marks the worker stale, holds, and
neither crashes nor stops)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.chaos.proxy import ChaosProxy, Mode
from bench.procs import Proc, free_port, start_controller
from fleet.store.redis import RedisStore
from tests.gateway.harness import eventually

from .rel_harness import fleet_of, write_env
from .rel_types import StartRedis, StartSims

pytestmark = pytest.mark.redis

CONTROL = {"authorization": "Bearer gearshift-dev-control"}
EARLIER = {"k": 4, "version": 1, "lease_seconds": 6}
"""The schedule an earlier controller applied (its lease as long as the controllers' schedule_lease_s)."""
TIMING = {"tick_s": 0.25, "leader_lease_s": 1.0, "schedule_lease_s": 6.0, "state_ttl_s": 5.0}


def _metric(text: str, name: str, label: str = "") -> float | None:
    for line in text.splitlines():
        if line.startswith(name) and label in line and not line.startswith("#"):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture
def prefix() -> str:
    return f"rel-ctl-{uuid.uuid4().hex[:8]}:"


@pytest.fixture
async def store(redis_url: str, prefix: str) -> AsyncIterator[RedisStore]:
    s = RedisStore.from_url(redis_url, prefix=prefix)
    yield s
    await s.close()


def _controller(name: str, env: dict[str, str], procs: list[Proc], tmp_path: Path) -> Proc:
    port = free_port()
    proc = start_controller(
        name, env={**env, "GEARSHIFT_HOLDER_ID": name, "GEARSHIFT_METRICS_PORT": str(port)}, log_dir=tmp_path
    )
    proc.port, proc.url = port, f"http://127.0.0.1:{port}"
    procs.append(proc)
    return proc


def _env(tmp_path: Path, url: str, redis_url: str, prefix: str, **extra: Any) -> dict[str, str]:
    shared: dict[str, Any] = {"redis_url": redis_url, "key_prefix": prefix, "allow_dev_secrets": 1}  # sims' dev token
    return write_env(tmp_path / "cfg", fleet_of([url]), **shared, **{**TIMING, **extra})


async def test_standby_takes_over_a_killed_leader_and_leases_expire_when_all_are_gone(
    sims: StartSims, procs: list[Proc], tmp_path: Path, redis_url: str, store: RedisStore, prefix: str
) -> None:
    (w,) = await sims(1)
    async with httpx.AsyncClient(base_url=w.url, timeout=5) as c:
        # a schedule some earlier controller applied: the leader learns version 1 and keeps renewing its lease
        put = await c.put("/gearshift/v1/speculation", json=EARLIER, headers=CONTROL)
        assert put.status_code == 200
        env = _env(tmp_path, w.url, redis_url, prefix)
        ctl = {name: _controller(name, env, procs, tmp_path) for name in ("ctl-a", "ctl-b")}
        # the earlier controller renews until a new one leads: start-up can outlast the 6 s lease on a loaded machine
        await eventually(lambda: _renewed_until_led(c, store), timeout_s=30, every_s=0.5)
        leader = await _holder(store)
        standby = "ctl-b" if leader == "ctl-a" else "ctl-a"
        first = (await c.get("/gearshift/v1/speculation")).json()
        await eventually(lambda: _lease_after(c, first["lease_expires_at"]), timeout_s=5)  # the leader renews

        ctl[leader].kill()
        killed_at = time.monotonic()
        await eventually(lambda: _holder_is(store, standby), timeout_s=3 * TIMING["leader_lease_s"] + 2)
        took_over_s = time.monotonic() - killed_at
        renewed = (await c.get("/gearshift/v1/speculation")).json()
        await eventually(lambda: _lease_after(c, renewed["lease_expires_at"]), timeout_s=5)  # the standby renews
        spec_metrics = (await c.get("/metrics")).text
        assert _metric(spec_metrics, "gearshift_worker_spec_lease_expired_total") == 0, (
            "the lease lapsed in the handover"
        )
        assert ctl[standby].alive()
        assert took_over_s <= 2 * TIMING["leader_lease_s"] + 1.0

        ctl[standby].kill()
        await eventually(lambda: _reverted(c), timeout_s=TIMING["schedule_lease_s"] + 3)
        state = (await c.get("/gearshift/v1/speculation")).json()
        assert state["schedule"] == state["fallback_schedule"]
        assert state["lease_expires_at"] is None
        assert _metric((await c.get("/metrics")).text, "gearshift_worker_spec_lease_expired_total") == 1


async def _has_holder(store: RedisStore) -> bool:
    return await store.lease_holder("controller") is not None


async def _renewed_until_led(c: httpx.AsyncClient, store: RedisStore) -> bool:
    """True once a controller holds the lease; until then renew the earlier controller's schedule (a 409 once
    the new leader has moved the worker past version 1 is that leader's doing, not an error)."""
    if await _has_holder(store):
        return True
    await c.put("/gearshift/v1/speculation", json=EARLIER, headers=CONTROL)
    return False


async def _holder(store: RedisStore) -> str:
    holder = await store.lease_holder("controller")
    assert holder is not None
    return holder


async def _holder_is(store: RedisStore, name: str) -> bool:
    return await store.lease_holder("controller") == name


async def _lease_after(c: httpx.AsyncClient, at: float) -> bool:
    state = (await c.get("/gearshift/v1/speculation")).json()
    return state["lease_expires_at"] is not None and state["lease_expires_at"] > at + 0.1


async def _reverted(c: httpx.AsyncClient) -> bool:
    state = (await c.get("/gearshift/v1/speculation")).json()
    return state["lease_expires_at"] is None


async def test_garbage_or_frozen_metrics_make_the_controller_hold_without_crashing(
    sims: StartSims, procs: list[Proc], tmp_path: Path, redis_url: str, store: RedisStore, prefix: str
) -> None:
    (w,) = await sims(1)
    chaos = await ChaosProxy(w.url).start()
    try:
        ctl = _controller("ctl", _env(tmp_path, chaos.url, redis_url, prefix), procs, tmp_path)
        async with httpx.AsyncClient(timeout=5) as c:

            async def metrics() -> str:
                try:
                    return (await c.get(ctl.url + "/metrics")).text
                except httpx.HTTPError:
                    return ""

            async def published(stale: bool) -> bool:
                state = (await store.worker_states()).get("w0")
                return state is not None and state.stale is stale

            await eventually(lambda: published(False), timeout_s=20)
            chaos.mode = Mode.FROZEN
            frozen_at = (await store.worker_states())["w0"].updated_at
            await eventually(lambda: _published_after(store, frozen_at + 1.0), timeout_s=5)
            assert ctl.alive(), ctl.log_tail()

            chaos.mode = Mode.GARBAGE
            await eventually(lambda: published(True), timeout_s=5)
            failures = "gearshift_controller_scrape_failures_total"

            async def failed_ticks(n: int) -> bool:
                return (_metric(await metrics(), failures, 'worker="w0"') or 0) >= n

            await eventually(lambda: failed_ticks(4), timeout_s=5)  # several garbage ticks in a row
            text = await metrics()
            assert _metric(text, "gearshift_controller_worker_stale", 'worker="w0"') == 1
            assert _metric(text, "gearshift_controller_leader") == 1
            assert ctl.alive(), ctl.log_tail()

            chaos.mode = Mode.OK
            await eventually(lambda: published(False), timeout_s=5)
            assert _metric(await metrics(), "gearshift_controller_worker_stale", 'worker="w0"') == 0
            assert ctl.alive()
    finally:
        await chaos.stop()


async def _more(read: Callable[[], Awaitable[float]], at_least: float) -> bool:
    return await read() >= at_least


async def _published_after(store: RedisStore, at: float) -> bool:
    state = (await store.worker_states()).get("w0")
    return state is not None and state.updated_at > at


async def test_controller_survives_a_redis_restart_and_leads_again(
    sims: StartSims, procs: list[Proc], tmp_path: Path, own_redis: StartRedis, prefix: str
) -> None:
    (w,) = await sims(1)
    redis = own_redis(persist=False)
    ctl = _controller("ctl", _env(tmp_path, w.url, redis.url, prefix), procs, tmp_path)
    store = RedisStore.from_url(redis.url, prefix=prefix)
    try:
        await eventually(lambda: _holder_is(store, "ctl"), timeout_s=20)
    finally:
        await store.close()
    async with httpx.AsyncClient(timeout=5) as c:

        async def tick_failures() -> float:
            return _metric((await c.get(ctl.url + "/metrics")).text, "gearshift_controller_tick_failures_total") or 0

        before = await tick_failures()
        assert redis.terminate() == 0
        await eventually(lambda: _more(tick_failures, before + 2), timeout_s=10)  # ticks fail against the dead store
    assert ctl.alive(), ctl.log_tail()
    own_redis(port=redis.port, persist=False)  # empty: the controller must take the lease again by itself
    store = RedisStore.from_url(redis.url, prefix=prefix)  # a fresh pool (see D9 for a pooled one)
    try:
        await eventually(lambda: _holder_is(store, "ctl"), timeout_s=20)
        await eventually(lambda: _published_after(store, 0.0), timeout_s=10)
        assert ctl.alive(), ctl.log_tail()
    finally:
        await store.close()
