"""What the Kubernetes overlay relies on in the gateway (issue 27): it sends the workers' API key, which a worker
started with vLLM's key checks, and through a fleet's cold start it stays ready (``ready_without_workers``) while
requests get 503 with ``Retry-After`` instead of connection errors. A real gateway on loopback, stub workers."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from tests.gateway.harness import FakeUpstream, eventually, make_fleet, make_tenants, serve_gateway

WORKER_KEY = "worker-key-0123456789abcdef"


class KeyedUpstream(FakeUpstream):
    """A worker that, like vLLM with ``VLLM_API_KEY``, answers 401 on ``/v1`` without the key (``/health`` open)."""

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("authorization") != f"Bearer {WORKER_KEY}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await super()._complete(request)


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.mark.parametrize("key", [WORKER_KEY, None])
async def test_the_gateway_sends_the_workers_api_key(key: str | None) -> None:
    worker = await KeyedUpstream().start()
    try:
        async with (
            serve_gateway(make_fleet([worker.url], model="m"), make_tenants(), upstream_api_key=key) as gw,
            gw.client() as client,
        ):
            await eventually(lambda: gw.gw.pool.ready())
            response = await client.post("/v1/chat/completions", json=CHAT)
            if key is None:
                assert response.status_code == 401, "without the key the worker refuses the gateway too"
            else:
                assert response.status_code == 200, response.text
                assert response.json()["usage"]["completion_tokens"] == 3
    finally:
        await worker.stop()


@pytest.mark.parametrize("ready_without_workers", [True, False])
async def test_no_worker_ready_is_a_503_with_retry_after_and_readiness_follows_the_setting(
    ready_without_workers: bool,
) -> None:
    worker = FakeUpstream(healthy=False)
    await worker.start()
    try:
        async with (
            serve_gateway(
                make_fleet([worker.url], model="m"), make_tenants(), ready_without_workers=ready_without_workers,
                no_worker_retry_after_s=7.0, health_interval_s=0.05, health_timeout_s=0.05,
            ) as gw,
            gw.client() as client,
        ):  # fmt: skip
            await asyncio.sleep(0.3)  # a few health rounds: the worker stays down (a cold start)
            ready = await client.get("/readyz")
            if ready_without_workers:
                assert ready.status_code == 200
                assert ready.json()["workers"] == "none ready"
            else:
                assert ready.status_code == 503
                assert ready.headers["retry-after"] == "7"
            response = await client.post("/v1/chat/completions", json=CHAT)
            assert response.status_code == 503
            assert response.headers["retry-after"] == "7"
            assert response.json()["error"]["code"] == "no_worker_available"
            worker.healthy = True
            await eventually(lambda: gw.gw.pool.ready())
            assert (await client.get("/readyz")).json()["status"] == "ready"
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    finally:
        await worker.stop()
