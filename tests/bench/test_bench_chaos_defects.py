"""Defects the chaos bench found (``gearshift bench chaos``, issue 23), each reproduced on real processes.

1. **A store that hangs holds admission forever.** The store-down fault SIGSTOPs every Redis node: connections
   stay open and nothing answers. A limited tenant's admit call then has no deadline, so the request waits for the
   whole outage instead of failing open (or closed, 503) as ``docs/operations/outages.md`` promises; the bench's
   clients gave up after 30 s. Failing open is only reached when the store *refuses* (a killed Redis).
2. **An answered request is lost from the ledger when its gateway dies before the record is written.** The usage
   record goes to a background writer after the stream is metered; the client has ``[DONE]`` while the record is
   still in memory (the writer lingers, or the store does not answer). A SIGKILL then loses it, although the client
   saw the answer (seen in the matrix: 2 answered requests missing after gateway-kill).

1 is fixed: an admit call has a deadline (``GatewaySettings.store_timeout_s``), past which the store counts as
failed and ``store_failure_mode`` applies. 2 is fixed: the record goes to the spool directory's journal
(``gateway.usage.spool.Journal``) before the answer's end is sent, and the next process on the directory writes what
a killed one left (``tests/gateway/test_gateway_journal.py`` has the fast tests of the ordering)."""

from __future__ import annotations

import asyncio
import math
import signal
import uuid
from pathlib import Path

import aiohttp
import pytest

from bench.procs import Proc, start_gateway, start_redis, start_sim
from bench.soak.client import StreamResult, stream_chat
from fleet.clock import SystemClock
from fleet.config import TenantConfig
from fleet.store.redis import RedisStore
from gateway.errors import StoreUnavailable
from gateway.intake.admission import Admitter
from gateway.usage.metrics import GatewayMetrics
from tests.gateway.harness import eventually
from tests.reliability.rel_harness import KEYS, chat, fleet_of, tenants_of, write_env

pytestmark = pytest.mark.redis

ANSWER_WITHIN_S = 5.0
"""Longer than any store timeout an operator would accept before failing open."""


async def test_admission_fails_open_when_the_store_hangs(tmp_path: Path) -> None:
    redis = start_redis(log_dir=tmp_path)
    store = RedisStore.from_url(redis.url, prefix=f"hang-{uuid.uuid4().hex[:8]}:")
    try:
        admitter = Admitter(
            store, clock=SystemClock(), metrics=GatewayMetrics(), failure_mode="open", local_share=1.0,
            store_timeout_s=1.0,
        )  # fmt: skip
        tenant = TenantConfig(id="acme", tier="standard", rpm=100)
        before = await admitter.admit(tenant, request_id="r-0", tokens=10)
        assert not before.local
        redis.pause()  # SIGSTOP: the kernel keeps the connection open, nothing answers
        during = await asyncio.wait_for(admitter.admit(tenant, request_id="r-1", tokens=10), ANSWER_WITHIN_S)
        assert during.local  # admitted on this replica's share, as failing open promises
    finally:
        redis.resume()
        await store.close()
        redis.stop()


async def test_admission_fails_closed_within_its_deadline_when_the_store_hangs(tmp_path: Path) -> None:
    redis = start_redis(log_dir=tmp_path)
    store = RedisStore.from_url(redis.url, prefix=f"hang-{uuid.uuid4().hex[:8]}:")
    try:
        admitter = Admitter(
            store, clock=SystemClock(), metrics=GatewayMetrics(), failure_mode="closed", store_timeout_s=1.0
        )
        tenant = TenantConfig(id="acme", tier="standard", rpm=100)
        await admitter.admit(tenant, request_id="r-0", tokens=10)
        redis.pause()
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(admitter.admit(tenant, request_id="r-1", tokens=10), ANSWER_WITHIN_S)
    finally:
        redis.resume()
        await store.close()
        redis.stop()


async def _stream_then_kill(url: str, gateway: Proc) -> StreamResult:
    """One stream; the gateway is SIGKILLed the moment the client has read ``[DONE]``."""

    def kill_at_done(r: StreamResult) -> None:
        if r.done:
            gateway.send(signal.SIGKILL)

    async with aiohttp.ClientSession() as s:
        return await stream_chat(s, url, key=KEYS["alpha"], body=chat(8), timeout_s=20, progress=kill_at_done)


@pytest.mark.heavy
async def test_an_answered_request_survives_its_gateway_dying_right_after_done(tmp_path: Path) -> None:
    sim = start_sim("w0", log_dir=tmp_path, speedup=50.0)
    redis = start_redis(log_dir=tmp_path / "redis")
    prefix = f"done-kill-{uuid.uuid4().hex[:8]}:"
    env = write_env(
        tmp_path / "cfg", fleet_of([sim.url]), tenants_of(), redis_url=redis.url, key_prefix=prefix,
        spool_dir=tmp_path / "spool",
    )  # fmt: skip
    procs: list[Proc] = [sim, redis]
    store = RedisStore.from_url(redis.url, prefix=prefix)
    try:
        gateway = start_gateway("gateway", env=env, log_dir=tmp_path)
        procs.append(gateway)
        redis.pause()  # the record cannot reach the store at once (a slow or partitioned Redis)
        answered = await _stream_then_kill(gateway.url, gateway)
        assert answered.ok, answered.error_type
        await asyncio.to_thread(gateway.popen.wait, 10)
        redis.resume()
        restarted = start_gateway("gateway-2", env=env, log_dir=tmp_path / "after")  # same spool
        procs.append(restarted)
        rid = answered.headers["x-request-id"]

        async def billed() -> bool:
            records = (await store.usage("alpha", since=0, until=math.inf, limit=100)).records
            return any(r.request_id == rid for r in records)

        await eventually(billed, timeout_s=15)
    finally:
        redis.resume()
        await store.close()
        for proc in reversed(procs):
            proc.stop()
