"""Every dashboard query returns data from a real Prometheus scraping a real stack under traffic.

The stack (deploy_stack) runs simulated workers, a flaky worker, a gateway and a controller on loopback;
traffic covers both tiers, a cancelled stream, a bad key and a tenant over its rate limit, so that every panel
— including retries, ejections, rejections and actuation failures — has something to show. Prometheus loads
the repository's rule files, so panels built on recorded series are checked too.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest

from dashboards.board import expressions

from .deploy_promql import grafana_to_promql, metric_names
from .deploy_stack import KEYS, Stack, running_prometheus, running_stack

DASHBOARDS = sorted((Path(__file__).resolve().parents[2] / "dashboards" / "grafana").glob("*.json"))
BODY = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 24, "stream": True}


async def stream(client: httpx.AsyncClient, tenant: str, *, cancel_after_first_chunk: bool = False) -> int:
    """One streamed chat. A cancelled one asks for a long answer, so the gateway surely sees the client leave
    mid-stream (a short one may finish before the disconnect is noticed and count as ``ok``)."""
    headers = {"authorization": f"Bearer {KEYS[tenant]}"}
    body = {**BODY, "max_tokens": 4000} if cancel_after_first_chunk else BODY
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        async for _ in response.aiter_bytes():
            if cancel_after_first_chunk:
                break
        return response.status_code


async def drive(stack: Stack, *, seconds: float, max_requests: int = 600) -> dict[int, int]:
    """Traffic of every kind for ``seconds`` (bounded in count); returns the count of each HTTP status."""
    statuses: dict[int, int] = {}
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=10) as client:

        async def loop(tenant: str) -> None:
            for _ in range(max_requests):
                if time.monotonic() > deadline:
                    return
                status = await stream(client, tenant)
                statuses[status] = statuses.get(status, 0) + 1

        bad = await client.get("/v1/models", headers={"authorization": "Bearer not-a-key"})
        statuses[bad.status_code] = 1
        for _ in range(4):  # tiny may send 2 per minute
            status = await stream(client, "tiny")
            statuses[status] = statuses.get(status, 0) + 1
        await stream(client, "demo", cancel_after_first_chunk=True)
        # A burst of the sheddable tier beyond the stack's overload capacity (2 in flight per worker, 1 queued):
        # some of it is shed, so the shed panel has data whatever the timing of the loops below.
        for status in await asyncio.gather(*(stream(client, "batch-demo") for _ in range(12))):
            statuses[status] = statuses.get(status, 0) + 1
        await asyncio.gather(loop("demo"), loop("demo"), loop("batch-demo"), loop("batch-demo"))
        await stream(client, "demo", cancel_after_first_chunk=True)
    return statuses


async def query(client: httpx.AsyncClient, prometheus: str, expr: str) -> list[dict[str, object]]:
    if expr.startswith("label_values("):
        (metric,) = metric_names(expr)
        response = await client.get(f"{prometheus}/api/v1/series", params={"match[]": metric})
    else:
        response = await client.get(f"{prometheus}/api/v1/query", params={"query": grafana_to_promql(expr)})
    body = response.json()
    assert body["status"] == "success", f"{expr}: {body}"
    data = body["data"]
    return data if isinstance(data, list) else data["result"]


@pytest.mark.prometheus
@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_every_panel_query_returns_data_from_a_live_stack(tmp_path: Path) -> None:
    async with running_stack(tmp_path) as stack, running_prometheus(stack, tmp_path) as prometheus:
        statuses = await drive(stack, seconds=10)
        assert statuses[200] > 20
        assert {401, 429} <= set(statuses)
        panels = [(p.stem, t, e) for p in DASHBOARDS for t, e in expressions(json.loads(p.read_text()))]
        empty = [f"{dashboard} / {title}: {expr}" for dashboard, title, expr in panels]
        async with httpx.AsyncClient(timeout=10) as client:
            for _ in range(5):  # series appear with the next scrape or rule evaluation (1 s): poll a few times
                await asyncio.sleep(2)
                empty = [
                    f"{dashboard} / {title}: {expr}"
                    for dashboard, title, expr in panels
                    if not await query(client, prometheus, expr)
                ]
                if not empty:
                    break
    assert len(panels) > 60
    assert empty == [], "queries without data:\n" + "\n".join(empty)
