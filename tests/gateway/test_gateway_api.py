"""The OpenAI-compatible API through a real gateway in front of fake workers on loopback."""

from __future__ import annotations

import httpx
import orjson

from .harness import MODEL, StartUpstreams, eventually, make_fleet, make_tenants, serve_gateway

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5}


async def status_is(client: httpx.AsyncClient, path: str, status: int) -> bool:
    return (await client.get(path)).status_code == status


def sse_events(text: str) -> list[str]:
    return [e.removeprefix("data: ") for e in text.strip().split("\n\n") if e]


async def test_chat_non_streaming_passes_through_with_usage_and_request_id(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, g.client() as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "custom_field": {"x": [1, 2]}, "top_k": 3})
        assert r.status_code == 200, r.text
        assert r.json()["usage"] == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
        assert r.headers["x-request-id"].startswith("req-")
        sent = w.bodies[-1]
        assert sent["custom_field"] == {"x": [1, 2]}
        assert sent["top_k"] == 3
        assert sent["priority"] == 0
        assert "stream_options" not in sent
        await g.gw.ledger.idle()
        usage = (await c.get("/v1/usage")).json()
        assert usage["requests"] == 1
        assert usage["completion_tokens"] == 5
        assert usage["prompt_tokens"] == 7
        assert usage["cost_usd"] > 0
        assert usage["data"][0]["request_id"] == r.headers["x-request-id"]


async def test_request_ids_are_the_gateways_own(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, g.client() as c:
        ids = {
            (await c.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "same"})).headers["x-request-id"]
            for _ in range(3)
        }
        assert len(ids) == 3
        assert "same" not in ids


async def test_stream_forces_usage_upstream_and_strips_it_when_not_asked(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, g.client("beta") as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert (r.headers["cache-control"], r.headers["x-accel-buffering"]) == ("no-cache", "no")
        assert r.headers["x-request-id"].startswith("req-")
        events = sse_events(r.text)
        assert events[-1] == "[DONE]"
        chunks = [orjson.loads(e) for e in events[:-1]]
        assert all("usage" not in ch for ch in chunks)
        assert "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks) == "tok " * 5
        assert w.bodies[-1]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
        assert w.bodies[-1]["priority"] == 10  # the batch tier's priority
        await g.gw.ledger.idle()
        usage = (await c.get("/v1/usage")).json()
        assert usage["completion_tokens"] == 5
        record = usage["data"][0]
        assert record["ttft_s"] is not None
        assert record["tpot_s"] is not None


async def test_stream_keeps_usage_chunk_when_asked(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, g.client() as c:
        body = {**CHAT, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": False}}
        r = await c.post("/v1/chat/completions", json=body)
        events = sse_events(r.text)
        last = orjson.loads(events[-2])
        assert last["choices"] == []
        assert last["usage"]["completion_tokens"] == 5
        assert all("usage" not in orjson.loads(e) for e in events[:-2]), "the client asked for no per-chunk usage"
        assert w.bodies[-1]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


async def test_text_completions_stream_and_not(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, g.client() as c:
        body = {"model": MODEL, "prompt": "once upon", "max_tokens": 3}
        r = await c.post("/v1/completions", json=body)
        assert r.json()["choices"][0]["text"] == "tok " * 3
        r = await c.post("/v1/completions", json={**body, "stream": True})
        assert sse_events(r.text)[-1] == "[DONE]"


async def test_models_lists_only_the_tenants_models(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g:
        async with g.client("alpha") as c:
            assert {m["id"] for m in (await c.get("/v1/models")).json()["data"]} == {MODEL, "other-model"}
        async with g.client("beta") as c:
            assert [m["id"] for m in (await c.get("/v1/models")).json()["data"]] == [MODEL]


async def test_ops_endpoints(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, g.client(None) as c:
        assert (await c.get("/healthz")).json() == {"status": "ok"}
        await eventually(lambda: status_is(c, "/readyz", 200))
        w.healthy = False
        await eventually(lambda: status_is(c, "/readyz", 503))
        async with g.client() as tenant:
            await tenant.post("/v1/chat/completions", json=CHAT)
        metrics = (await c.get("/metrics")).text
        assert "gearshift_gateway_worker_healthy" in metrics


async def test_openapi_document_declares_bodies_errors_and_auth(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, g.client(None) as c:
        doc = (await c.get("/openapi.json")).json()
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    schema = chat["requestBody"]["content"]["application/json"]["schema"]
    assert schema["required"] == ["model", "messages"]
    assert chat["security"] == [{"apiKey": []}]
    assert chat["responses"]["429"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorBody"
    }
    assert doc["paths"]["/admin/v1/keys"]["post"]["security"] == [{"adminKey": []}]
    assert "security" not in doc["paths"]["/healthz"]["get"]
    assert doc["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
