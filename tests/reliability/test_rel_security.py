"""Keys, tenants and the upstream boundary: secrets never logged and stored only as keyed digests, the admin API
on its own key, usage isolated per tenant, no request field able to redirect the upstream (SSRF), hop-by-hop and
internal headers not forwarded either way, and the workers' control API closed without the control token."""

from __future__ import annotations

import hmac
import logging
import time
import uuid
from collections.abc import AsyncIterator

import aiohttp
import httpx
import pytest
from redis.asyncio import Redis

from bench.chaos.proxy import ChaosProxy
from bench.procs import Proc
from bench.soak.client import stream_chat
from fleet.config import key_digest
from fleet.store.redis import RedisStore

from .rel_harness import ADMIN_KEY, KEYS, MODEL, PEPPER, chat, fleet_of, live_gateway
from .rel_types import StartSims

pytestmark = pytest.mark.redis


@pytest.fixture
async def chaos(shared_workers: list[Proc]) -> AsyncIterator[ChaosProxy]:
    proxy = await ChaosProxy(shared_workers[0].url).start()
    yield proxy
    await proxy.stop()


async def test_secrets_are_never_logged_and_stored_only_as_keyed_digests(
    chaos: ChaosProxy, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    prefix = f"rel-sec-{uuid.uuid4().hex[:8]}:"
    store = RedisStore.from_url(redis_url, prefix=prefix)
    try:
        async with live_gateway(fleet_of([chaos.url]), store=store) as live:
            admin = {"authorization": f"Bearer {ADMIN_KEY}"}
            async with httpx.AsyncClient(base_url=live.url, headers=admin) as c:
                created = (await c.post("/admin/v1/keys", json={"tenant": "beta"})).json()
                secret = created["secret"]
                for bad in (KEYS["alpha"] + "x", "sk-" + "A" * 40):
                    r = await c.post("/v1/chat/completions", json=chat(2), headers={"authorization": f"Bearer {bad}"})
                    assert r.status_code == 401
                assert (await c.delete(f"/admin/v1/keys/{created['key_id']}")).status_code == 200
                await c.post("/admin/v1/keys", json={"tenant": "beta"}, headers={"authorization": "Bearer wrong-admin"})
            async with aiohttp.ClientSession() as s:
                for key in (KEYS["alpha"], secret):
                    await stream_chat(s, live.url, key=key, body=chat(2))
            await live.gw.ledger.idle()
        redis = Redis.from_url(redis_url)
        try:
            stored = b""
            async for name in redis.scan_iter(match=f"{prefix}*"):
                kind = await redis.type(name)
                assert isinstance(kind, bytes)  # the client does not decode responses
                value = {
                    "string": redis.get, "hash": redis.hgetall, "set": redis.smembers,
                    "zset": lambda n: redis.zrange(n, 0, -1), "stream": lambda n: redis.xrange(n),
                }[kind.decode()](name)  # fmt: skip
                stored += name + repr(await value).encode()
        finally:
            await redis.aclose()
    finally:
        await store.close()
    assert key_digest(secret, pepper=PEPPER).encode() in stored, "the created key's keyed digest is not stored"
    for s_ in (secret, KEYS["alpha"], ADMIN_KEY):
        assert s_.encode() not in stored, "a secret is stored in Redis in clear"
        assert key_digest(s_, pepper="").encode() not in stored, "an unkeyed digest is stored"
    logged = caplog.text + "".join(str(r.args) for r in caplog.records)
    for s_ in (secret, KEYS["alpha"], ADMIN_KEY, "wrong-admin", "A" * 40):
        assert s_ not in logged, "a secret appeared in the logs"
    assert not any(s_.encode() in b"".join(chaos.bodies) for s_ in (secret, KEYS["alpha"]))


async def test_admin_api_needs_the_admin_key_and_tenant_keys_cannot_use_it(chaos: ChaosProxy) -> None:
    # 20 failed attempts from one address: above the failed-auth limit's default (test_rel_admin_bodies covers it)
    gateway = live_gateway(fleet_of([chaos.url]), admin_auth_failures_per_minute=100)
    async with gateway as live, httpx.AsyncClient(base_url=live.url) as c:
        for key in (KEYS["alpha"], None, "x", ADMIN_KEY + "x"):
            headers = {"authorization": f"Bearer {key}"} if key is not None else {}
            for method, path in (("GET", "/admin/v1/keys"), ("GET", "/admin/v1/usage/alpha"),
                                 ("POST", "/admin/v1/keys"), ("DELETE", "/admin/v1/keys/alpha-1"),
                                 ("GET", "/admin/v1/workers")):  # fmt: skip
                r = await c.request(method, path, headers=headers, json={"tenant": "alpha"})
                assert r.status_code == 401, (key, method, path, r.status_code)
                assert r.json()["error"]["type"] == "authentication_error"
        r = await c.post("/v1/chat/completions", json=chat(2), headers={"authorization": f"Bearer {ADMIN_KEY}"})
        assert r.status_code == 401, "the admin key works as a tenant key"
        r = await c.get("/admin/v1/keys", headers={"authorization": f"Bearer {ADMIN_KEY}"})
        assert r.status_code == 200
        assert all("secret" not in k and "digest" not in k for k in r.json()["data"])


async def test_a_tenant_reads_only_its_own_usage(chaos: ChaosProxy) -> None:
    async with live_gateway(fleet_of([chaos.url])) as live:
        async with aiohttp.ClientSession() as s:
            assert (await stream_chat(s, live.url, key=KEYS["alpha"], body=chat(3))).ok
            for _ in range(2):
                assert (await stream_chat(s, live.url, key=KEYS["beta"], body=chat(5))).ok
        await live.gw.ledger.idle()
        async with httpx.AsyncClient(base_url=live.url, headers={"authorization": f"Bearer {KEYS['alpha']}"}) as c:
            queries: tuple[dict[str, str | int], ...] = (
                {},
                {"tenant": "beta"},
                {"tenant_id": "beta", "since": 0, "limit": 100},
            )
            for params in queries:
                usage = (await c.get("/v1/usage", params=params)).json()
                assert usage["tenant"] == "alpha"
                assert usage["requests"] == 1
                assert usage["completion_tokens"] == 3
                assert {d["tenant"] for d in usage["data"]} == {"alpha"}
            assert (await c.get("/admin/v1/usage/beta")).status_code == 401
            assert (await c.get("/v1/usage/beta")).status_code in (404, 405)


async def test_no_request_field_or_header_redirects_the_upstream(chaos: ChaosProxy, shared_workers: list[Proc]) -> None:
    canary = await ChaosProxy(shared_workers[1].url).start()  # not in the fleet: any request reaching it is an SSRF
    evil = canary.url + "/v1/chat/completions"
    host = canary.url.removeprefix("http://")
    bodies = [
        chat(2, url=evil), chat(2, base_url=canary.url), chat(2, api_base=canary.url), chat(2, endpoint=evil),
        chat(2, worker_url=evil), chat(2, worker="w-evil"), chat(2, extra_body={"base_url": canary.url}),
        {**chat(2), "model": evil}, {**chat(2), "model": f"{MODEL}@{host}"}, {**chat(2), "model": f"//{host}/x"},
    ]  # fmt: skip
    headers = {"host": host, "x-forwarded-host": host, "x-gearshift-worker": canary.url, "x-upstream": canary.url,
               "forwarded": f"host={host}", "x-original-url": evil}  # fmt: skip
    try:
        async with live_gateway(fleet_of([chaos.url])) as live, aiohttp.ClientSession() as s:
            for body in bodies:
                r = await stream_chat(s, live.url, key=KEYS["alpha"], body=body, headers=headers)
                assert r.ok or r.status in (400, 404), r
    finally:
        await canary.stop()
    assert canary.paths == [], f"requests reached a worker that is not in the fleet: {canary.paths}"
    assert len(chaos.bodies) >= len(bodies) - 3, "the requests did not reach the fleet's worker either"


INTERNAL_REQUEST_HEADERS = {
    "connection": "keep-alive, x-hop-secret",
    "x-hop-secret": "hop",
    "proxy-authorization": "Basic c2VjcmV0",
    "x-forwarded-for": "10.0.0.1",
    "x-gearshift-tenant": "beta",
    "x-gearshift-internal": "1",
    "cookie": "session=abc",
}


async def test_hop_by_hop_and_internal_headers_are_not_forwarded_either_way(chaos: ChaosProxy) -> None:
    chaos.extra_response_headers = {
        "x-internal-worker": "sim-secret", "set-cookie": "worker=1", "x-vllm-engine": "0", "server": "worker/1.0",
    }  # fmt: skip
    async with live_gateway(fleet_of([chaos.url])) as live, aiohttp.ClientSession() as s:
        streamed = await stream_chat(s, live.url, key=KEYS["alpha"], body=chat(2), headers=INTERNAL_REQUEST_HEADERS)
        async with s.post(
            live.url + "/v1/chat/completions", json=chat(2),
            headers={**INTERNAL_REQUEST_HEADERS, "authorization": f"Bearer {KEYS['alpha']}"},
        ) as resp:  # fmt: skip
            assert resp.status == 200
            whole = {k.lower(): v for k, v in resp.headers.items()}
    assert streamed.ok
    assert len(chaos.seen_headers) == 2
    for seen in chaos.seen_headers:
        leaked = {h for h in [*INTERNAL_REQUEST_HEADERS, "authorization"] if h in seen}
        assert not leaked, f"forwarded to the worker: {leaked}"
    for got in (streamed.headers, whole):
        assert not {"x-internal-worker", "set-cookie", "x-vllm-engine"} & set(got), got
        assert got.get("server") != "worker/1.0"


async def test_control_api_writes_need_the_control_token(sims: StartSims) -> None:
    (w,) = await sims(1)  # its own worker: this test changes the schedule
    update = {"k": 2, "version": 5, "lease_seconds": 30, "reason": "rel"}
    async with httpx.AsyncClient(base_url=w.url) as c:
        before = (await c.get("/gearshift/v1/speculation")).json()
        for auth in (
            None,
            "Bearer",
            "Bearer wrong-token",
            "Basic Z2VhcnNoaWZ0LWRldi1jb250cm9s",
            "Token gearshift-dev-control",
        ):
            headers = {"authorization": auth} if auth is not None else {}
            r = await c.put("/gearshift/v1/speculation", json=update, headers=headers)
            assert r.status_code == 401, auth
        assert (await c.get("/gearshift/v1/speculation")).json()["version"] == before["version"]
        ok = await c.put(
            "/gearshift/v1/speculation", json=update, headers={"authorization": "Bearer gearshift-dev-control"}
        )
        assert ok.status_code == 200
        assert ok.json()["version"] == 5
        assert ok.json()["lease_expires_at"] > time.time()


async def test_admin_and_run_time_keys_are_compared_in_constant_time(
    chaos: ChaosProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    compared: list[tuple[bytes | str, bytes | str]] = []
    real = hmac.compare_digest

    def spy(a: bytes | str, b: bytes | str) -> bool:
        compared.append((a, b))
        if isinstance(a, str) and isinstance(b, str):
            return real(a, b)
        if isinstance(a, bytes) and isinstance(b, bytes):
            return real(a, b)
        raise TypeError("compare_digest takes two str or two bytes")  # as the real one does

    monkeypatch.setattr(hmac, "compare_digest", spy)
    async with live_gateway(fleet_of([chaos.url])) as live, httpx.AsyncClient(base_url=live.url) as c:
        r = await c.get("/admin/v1/keys", headers={"authorization": "Bearer not-the-admin-key"})
        assert r.status_code == 401
        assert any(b"not-the-admin-key" in (a if isinstance(a, bytes) else a.encode()) for a, _ in compared)
        compared.clear()
        created = await c.post(
            "/admin/v1/keys", json={"tenant": "alpha"}, headers={"authorization": f"Bearer {ADMIN_KEY}"}
        )
        secret = created.json()["secret"]
        r = await c.get("/v1/models", headers={"authorization": f"Bearer {secret}"})
        assert r.status_code == 200
    digest = key_digest(secret, pepper=PEPPER)
    assert any(digest in (a, b) for a, b in compared), "the run-time key's digest was not compared in constant time"
    assert not any(secret in (a, b) for a, b in compared), "a secret was compared instead of its keyed digest"
