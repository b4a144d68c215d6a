"""Measure what gearshift keeps in Redis per request (the ledger), per tenant (limit windows, slots, spend
counters) and per worker (published state), on a real ``redis-server`` started here. The sizing in
docs/operations comes from it:

    python deploy/sizing/store_bytes.py

Records are shaped like a Kimi K3 chat request's (all optional fields set, a 44-character request id)."""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from pathlib import Path

import redis.asyncio as aioredis

from bench.procs import start_redis
from fleet.budget_period import billed_counters
from fleet.store.keys import KeyLayout
from fleet.store.protocol import Limit, SlotLimit, UsageRecord, WindowLimit, WorkerState
from fleet.store.redis import RedisStore

REQUESTS, TENANTS, WORKERS = 20_000, 200, 200


def record(i: int, now: float) -> UsageRecord:
    at = now + i * 0.1
    return UsageRecord(
        request_id=f"chatcmpl-{uuid.uuid4().hex}", tenant="acme", model="kimi-k3", worker_id="kimi-k3-0",
        prompt_tokens=1834, completion_tokens=412, cost_usd=0.00123456789, status="ok", ttft_s=0.812,
        tpot_s=0.0213, at=at, arrived_at=at - 5, tier="interactive", workload="chat", cached_tokens=1024,
        admitted_at=at - 4.9,
    )  # fmt: skip


async def used(client: aioredis.Redis) -> int:
    return int((await client.info("memory"))["used_memory"])


async def measure(url: str) -> dict[str, float]:
    store, client = RedisStore.from_url(url, prefix="size:"), aioredis.from_url(url)
    now, out = time.time(), {}
    try:
        before = await used(client)
        records = [record(i, now) for i in range(REQUESTS)]
        for i in range(0, REQUESTS, 256):
            await store.append_usage_many(records[i : i + 256])
        out["bytes per request (ledger: stream, index, roll-ups, ids)"] = (await used(client) - before) / REQUESTS
        out["  of which the JSON record"] = len(records[0].model_dump_json())
        counters = [KeyLayout("size:").limit(c.key) for c in billed_counters("acme", records[-1].at)]
        out["bytes per tenant's spend counters (lifetime, day, week, month)"] = sum(
            [int(await client.memory_usage(key) or 0) for key in counters]
        )
        before = await used(client)
        for t in range(TENANTS):
            limits: list[Limit] = [
                WindowLimit(key=f"rpm:t{t}", cost=1, limit=600, window_s=60.0),
                WindowLimit(key=f"tpm:t{t}", cost=4000, limit=2_000_000, window_s=60.0),
                SlotLimit(key=f"concurrency:t{t}", slot_id=uuid.uuid4().hex, limit=64),
            ]
            for second in range(60):  # a minute of traffic fills every bucket of the windows
                await store.admit(limits[:2], now=now + second)
            await store.admit(limits[2:], now=now)
        out["bytes per tenant (rpm and tpm windows, one held slot)"] = (await used(client) - before) / TENANTS
        before = await used(client)
        for w in range(WORKERS):
            state = WorkerState(
                worker_id=f"kimi-k3-{w}", model="kimi-k3", k_desired=4, k_applied=4, accepted_length=3.9,
                acceptance_per_pos=[0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3], tpot_predicted_s=0.02, running=12,
                waiting=1, kv_usage=0.4, usd_per_mtok=3.1, usd_per_mtok_k0=4.2, drafter_share=0.08,
            )  # fmt: skip
            await store.publish_worker_state(state, ttl_s=60)
        out["bytes per worker (published state)"] = (await used(client) - before) / WORKERS
    finally:
        await store.close()
        await client.aclose()
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as logs:
        proc = start_redis(log_dir=Path(logs))
        try:
            for name, value in asyncio.run(measure(proc.url)).items():
                print(f"{name:60s} {value:8.0f}")
        finally:
            proc.stop(timeout_s=5)


if __name__ == "__main__":
    main()
