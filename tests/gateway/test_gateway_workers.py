"""``gearshift gateway --workers 2``: two processes on one port, one ``/metrics`` view of both, an exact ledger; the
memory store refuses more than one worker."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.gateway.gearshift_target import BENCH_KEY, GearshiftLauncher, write_config
from bench.gateway.targets import UpstreamLauncher
from bench.procs import gearshift_argv, start_redis
from fleet.store.redis import RedisStore

pytestmark = [pytest.mark.redis, pytest.mark.heavy]  # real processes: 30-120 s on a loaded 2-core machine


REQUESTS = 60


def _requests_total(text: str) -> float:
    family = next(f for f in text_string_to_metric_families(text) if f.name == "gearshift_gateway_requests")
    return sum(s.value for s in family.samples if s.name.endswith("_total"))


def _pids(text: str) -> set[str]:
    return {s.labels["pid"] for f in text_string_to_metric_families(text) for s in f.samples if "pid" in s.labels}


async def test_two_workers_share_one_port_one_metrics_view_and_an_exact_ledger(tmp_path: Path) -> None:
    redis = start_redis(log_dir=tmp_path)
    upstream = UpstreamLauncher().launch(cpu=None, log_dir=tmp_path)
    gateway = None
    try:
        gateway = GearshiftLauncher("gearshift-2", redis=True, workers=2).launch(
            upstream=upstream.base_url, redis_url=redis.url, cpu=None, log_dir=tmp_path
        )
        headers = {"Authorization": f"Bearer {BENCH_KEY}"}
        body = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        limits = httpx.Limits(max_keepalive_connections=0)  # a new connection each: the kernel spreads them
        async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30, limits=limits) as client:
            answers = await asyncio.gather(
                *(client.post("/v1/chat/completions", json=body, headers=headers) for _ in range(REQUESTS))
            )
            assert [r.status_code for r in answers] == [200] * REQUESTS
            store = RedisStore.from_url(redis.url)
            try:
                for _ in range(100):  # usage records land after the responses
                    records = await store.ledger(since=0.0, until=1e12, limit=10 * REQUESTS)
                    if len(records) >= REQUESTS:
                        break
                    await asyncio.sleep(0.1)
                await asyncio.sleep(0.5)  # anything past the count would land now
                records = await store.ledger(since=0.0, until=1e12, limit=10 * REQUESTS)
            finally:
                await store.close()
            assert len(records) == REQUESTS  # exact: every request once
            assert len({r.request_id for r in records}) == REQUESTS
            text = (await client.get("/metrics")).text  # one scrape, whichever process answers it
        assert _requests_total(text) == REQUESTS  # both processes' counters, summed
        assert len(_pids(text)) == 2  # and both processes are in the view
        families = {f.name for f in text_string_to_metric_families(text)}
        assert {"gearshift_gateway_asyncio_tasks", "gearshift_gateway_open_connections"} <= families  # measured
    finally:
        if gateway is not None:
            gateway.stop()
        upstream.stop()
        redis.stop()


def test_the_memory_store_refuses_more_than_one_worker(tmp_path: Path) -> None:
    fleet, tenants = write_config(tmp_path, upstream="http://127.0.0.1:9", pepper="workers-test-pepper")
    files = {"GEARSHIFT_FLEET_FILE": str(fleet), "GEARSHIFT_TENANTS_FILE": str(tenants)}
    done = subprocess.run(
        [*gearshift_argv("gateway", "--workers", "2")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(Path(sys.executable).parent), "GEARSHIFT_REDIS_URL": "", **files},
        check=False,
    )
    assert done.returncode == 2
    assert "--workers 2 needs a shared store" in done.stderr
