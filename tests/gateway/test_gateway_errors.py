"""Every error path returns an OpenAI-shaped body with the right status and type."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from .harness import MODEL, Mode, StartUpstreams, eventually, make_fleet, make_tenants, serve_gateway

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def error_of(r: httpx.Response, status: int, type_: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == type_
    assert set(err) == {"message", "type", "param", "code"}
    assert r.headers["x-request-id"]
    return dict(err)


async def test_authentication_errors(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g:
        async with g.client(None) as c:
            err = error_of(await c.post("/v1/chat/completions", json=CHAT), 401, "authentication_error")
            assert err["code"] == "missing_api_key"
            r = await c.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer sk-wrong"})
            assert error_of(r, 401, "authentication_error")["code"] == "invalid_api_key"
            r = await c.get("/v1/models", headers={"authorization": "Basic abc"})
            error_of(r, 401, "authentication_error")
        async with g.client("alpha") as c:
            error_of(await c.get("/admin/v1/keys"), 401, "authentication_error")
    assert w.bodies == []


async def test_runtime_key_lifecycle_and_revocation(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, g.admin() as admin:
        created = (await admin.post("/admin/v1/keys", json={"tenant": "beta", "key_id": "ci"})).json()
        secret = created["secret"]
        listed = (await admin.get("/admin/v1/keys", params={"tenant": "beta"})).json()["data"]
        assert {k["key_id"] for k in listed} == {"beta-1", "ci"}
        assert secret not in orjson.dumps(listed).decode()
        assert all(secret not in r.digest for r in await g.store.api_keys())
        headers = {"authorization": f"Bearer {secret}"}
        async with httpx.AsyncClient(base_url=g.url, headers=headers) as c:
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
            assert (await admin.delete("/admin/v1/keys/ci")).json() == {"key_id": "ci", "revoked": True}
            error_of(await c.post("/v1/chat/completions", json=CHAT), 401, "authentication_error")
        error_of(await admin.delete("/admin/v1/keys/nope"), 404, "not_found_error")
        error_of(await admin.delete("/admin/v1/keys/beta-1"), 400, "invalid_request_error")
        error_of(await admin.post("/admin/v1/keys", json={"tenant": "nobody"}), 400, "invalid_request_error")
        error_of(await admin.post("/admin/v1/keys", json={"tenant": 3, "x": 1}), 400, "invalid_request_error")


async def test_model_errors(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g:
        async with g.client("gamma") as c:
            err = error_of(await c.post("/v1/chat/completions", json=CHAT), 403, "permission_error")
            assert err["param"] == "model"
        async with g.client("alpha") as c:
            r = await c.post("/v1/chat/completions", json={**CHAT, "model": "gpt-9"})
            assert error_of(r, 404, "invalid_request_error")["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (orjson.dumps({"messages": [{"role": "user", "content": "x"}]}), "model"),
        (orjson.dumps({"model": MODEL}), "messages"),
        (orjson.dumps({**CHAT, "stream": "yes"}), "stream"),
        (orjson.dumps({**CHAT, "max_tokens": -1}), "max_tokens"),
    ],
)
async def test_malformed_requests(upstreams: StartUpstreams, body: bytes, param: str | None) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, g.client() as c:
        r = await c.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert error_of(r, 400, "invalid_request_error")["param"] == param


async def test_body_too_large(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants(), max_body_bytes=2000) as g, g.client() as c:
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
        error_of(await c.post("/v1/chat/completions", json=big), 413, "invalid_request_error")

        async def chunked() -> Any:
            for _ in range(10):
                yield b" " * 500

        r = await c.post("/v1/chat/completions", content=chunked())
        error_of(r, 413, "invalid_request_error")
    assert w.bodies == []


async def test_unknown_route_and_method_are_openai_shaped(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, g.client() as c:
        error_of(await c.get("/v1/nope"), 404, "not_found_error")
        r = await c.get("/v1/chat/completions")
        error_of(r, 405, "invalid_request_error")
        assert r.headers["allow"] == "POST"
        error_of(await c.put("/v1/models"), 405, "invalid_request_error")
        counts = _error_counts((await c.get("/metrics")).text)
    assert counts == {"not_found_error": 1.0, "invalid_request_error": 2.0}


# -------------------------------------------------------------------------------------------- admission
async def test_rpm_exceeded_with_retry_after(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants(alpha={"rpm": 2})) as g, g.client() as c:
        for _ in range(2):
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
        r = await c.post("/v1/chat/completions", json=CHAT)
        assert error_of(r, 429, "rate_limit_error")["code"] == "rpm_exceeded"
        assert r.headers["x-gearshift-limit"] == "rpm"
        assert 1 <= int(r.headers["retry-after"]) <= 61  # whole seconds, rounded up
        async with g.client("beta") as other:  # limits are per tenant
            assert (await other.post("/v1/chat/completions", json=CHAT)).status_code == 200
        metrics = (await c.get("/metrics")).text
        assert 'gearshift_gateway_admission_rejections_total{reason="rpm",tenant="alpha"} 1.0' in metrics


async def test_tpm_reserves_estimate_and_settles_real_usage(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants(alpha={"tpm": 100})) as g, g.client() as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 150})
        assert error_of(r, 429, "rate_limit_error")["code"] == "tpm_exceeded"
        # 1 + 8 + 60 = 69 reserved up front, 7 + 8 = 15 used: the refund leaves room for more such requests
        for _ in range(3):
            r = await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 60})
            assert r.status_code == 200, r.text
        assert w.bodies[-1]["max_tokens"] == 60


async def test_concurrency_limit_holds_and_releases(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1, chunks=40, delay_s=0.02)
    tenants = make_tenants(alpha={"max_concurrency": 1})
    async with serve_gateway(make_fleet([w.url]), tenants) as g, g.client() as c:
        async with c.stream(
            "POST", "/v1/chat/completions", json={"model": MODEL, "messages": CHAT["messages"], "stream": True}
        ) as s:
            assert s.status_code == 200
            r = await c.post("/v1/chat/completions", json=CHAT)
            assert error_of(r, 429, "rate_limit_error")["code"] == "concurrency_exceeded"
            await s.aread()
        assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200


async def test_budget_exceeded(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants(alpha={"budget_usd": 1e-9})) as g, g.client() as c:
        assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
        r = await c.post("/v1/chat/completions", json=CHAT)
        assert error_of(r, 429, "insufficient_quota")["code"] == "budget_exceeded"  # its unbilled cost counted here
        await g.gw.ledger.idle()  # the ledger writes after its linger (GatewaySettings.ledger_linger_s)
        assert await g.store.spent("spend:alpha") > 1e-9
        errors = _error_counts((await c.get("/metrics")).text)
    assert errors == {"insufficient_quota": 1.0}  # by the error's type, not as the 429's rate_limit_error


def _error_counts(metrics: str) -> dict[str, float]:
    """``gearshift_gateway_errors_total`` by its ``type`` label."""
    family = next(f for f in text_string_to_metric_families(metrics) if f.name == "gearshift_gateway_errors")
    return {s.labels["type"]: s.value for s in family.samples if s.name.endswith("_total")}


# --------------------------------------------------------------------------------------------- upstream
async def test_all_workers_down_is_503() -> None:
    from bench.procs import free_port

    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    async with serve_gateway(make_fleet(urls), make_tenants()) as g, g.client() as c:
        r = await c.post("/v1/chat/completions", json=CHAT)
        assert error_of(r, 503, "api_error")["code"] == "no_worker_available"
        await eventually(lambda: _all_unhealthy(g.url))
        r = await c.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert error_of(r, 503, "api_error")["code"] == "no_worker_available"
        assert (await c.get("/readyz")).status_code == 503


async def _all_unhealthy(url: str) -> bool:
    async with httpx.AsyncClient(base_url=url) as c:
        return (await c.get("/readyz")).status_code == 503


@pytest.mark.parametrize("mode", [Mode.DROP, Mode.HTTP_500, Mode.HANG])
@pytest.mark.parametrize("stream", [False, True])
async def test_failure_before_first_byte_is_retried_on_another_worker(
    upstreams: StartUpstreams, mode: Mode, stream: bool
) -> None:
    bad, good = await upstreams(2)
    bad.mode = mode
    fleet = make_fleet([bad.url, good.url])
    settings: dict[str, Any] = {"first_byte_timeout_s": 0.3, "request_timeout_s": 0.3, "eject_after_failures": 100}
    async with serve_gateway(fleet, make_tenants(), **settings) as g, g.client() as c:
        for _ in range(20):  # the router's tie-break is random: go on until the bad worker was tried
            r = await c.post("/v1/chat/completions", json={**CHAT, "stream": stream})
            assert r.status_code == 200, r.text
            assert r.text.endswith("data: [DONE]\n\n") if stream else r.json()["usage"]["completion_tokens"] == 4
            if bad.bodies:
                break
        assert bad.bodies, "the failing worker was never tried"
        metrics = (await c.get("/metrics")).text
        assert "gearshift_gateway_upstream_retries_total" in metrics


async def test_garbage_answer_is_502(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1, mode=Mode.GARBAGE)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, g.client() as c:
        error_of(await c.post("/v1/chat/completions", json=CHAT), 502, "api_error")
        r = await c.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert r.status_code == 200
        assert _stream_error(r.text)["code"] == "upstream_failed"


def _stream_error(text: str) -> dict[str, Any]:
    """The error event before the final ``[DONE]`` of a failed stream."""
    events = [e.removeprefix("data: ") for e in text.strip().split("\n\n")]
    assert events[-1] == "[DONE]"
    return dict(orjson.loads(events[-2])["error"])


@pytest.mark.parametrize("mode", [Mode.DIE_MID_STREAM, Mode.TRUNCATE])
async def test_failure_mid_stream_ends_with_error_event_and_done(
    upstreams: StartUpstreams, mode: Mode, caplog: pytest.LogCaptureFixture
) -> None:
    (w,) = await upstreams(1, mode=mode, die_after=2, chunks=6)
    spans = InMemorySpanExporter()
    async with serve_gateway(make_fleet([w.url]), make_tenants(), span_exporter=spans) as g, g.client() as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 6, "stream": True})
        assert r.status_code == 200
        events = [e.removeprefix("data: ") for e in r.text.strip().split("\n\n")]
        contents = [orjson.loads(e)["choices"][0]["delta"]["content"] for e in events[:-2]]
        assert contents == ["", "tok ", "tok "]
        err = _stream_error(r.text)
        assert err["type"] == "api_error"
        request_id = r.headers["x-request-id"]
        assert err["message"] == f"The upstream worker failed while streaming; request id {request_id}."
        assert len(w.bodies) == 1  # never retried after the first byte
        await g.gw.ledger.idle()
        assert [rec.status for rec in (await g.store.usage("alpha", since=0, until=1e12)).records] == ["error"]
        assert _error_counts((await c.get("/metrics")).text) == {"api_error": 1.0}
    logged = [rec.getMessage() for rec in caplog.records if request_id in rec.getMessage()]
    assert logged, "the failure is logged under the request id"
    assert "worker w0" in logged[0], "the log names the worker the client is not told"
    (server,) = [s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert "worker w0" in (server.status.description or "")


@pytest.mark.parametrize("stream", [False, True])
async def test_worker_failures_before_the_answer_do_not_name_the_worker(
    upstreams: StartUpstreams, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    (w,) = await upstreams(1, mode=Mode.HTTP_500)
    settings: dict[str, Any] = {"max_retries": 0, "first_byte_timeout_s": 0.5, "request_timeout_s": 0.5}
    async with serve_gateway(make_fleet([w.url]), make_tenants(), **settings) as g, g.client() as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        err = error_of(r, 502, "api_error")
        assert err["message"] == f"The upstream worker failed; request id {r.headers['x-request-id']}."
        w.mode = Mode.HANG
        r = await c.post("/v1/chat/completions", json={**CHAT, "stream": stream})
    err = error_of(r, 504, "api_error")
    assert err["message"] == f"The upstream worker did not answer within 0.5 s; request id {r.headers['x-request-id']}."
    assert any("worker w0 answered 500: " in rec.getMessage() and "engine crashed" in rec.getMessage()
               for rec in caplog.records)  # fmt: skip


async def test_a_stream_cut_short_is_metered_in_tokens_not_chunks(upstreams: StartUpstreams) -> None:
    """Each chunk carries up to k + 1 tokens; the running usage the gateway asks for counts them."""
    (w,) = await upstreams(1, mode=Mode.DIE_MID_STREAM, die_after=3, chunks=20, tokens_per_chunk=4)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, g.client() as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 20, "stream": True})
        assert _stream_error(r.text)["code"] == "upstream_failed"
        assert '"usage"' not in r.text, "the per-chunk usage the gateway asked for is not the client's"
        assert w.bodies[0]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
        await g.gw.ledger.idle()
        (record,) = (await g.store.usage("alpha", since=0, until=1e12)).records
    assert (record.prompt_tokens, record.completion_tokens) == (7, 12)


@pytest.mark.parametrize(
    ("options", "chunk_usage", "final_usage"),
    [
        ({"include_usage": True}, False, True),
        ({"include_usage": True, "continuous_usage_stats": True}, True, True),
        ({"continuous_usage_stats": True}, False, False),  # vLLM: continuous stats only with include_usage
    ],
)
async def test_the_client_gets_the_usage_it_asked_for(
    upstreams: StartUpstreams, options: dict[str, bool], chunk_usage: bool, final_usage: bool
) -> None:
    (w,) = await upstreams(1, chunks=8, tokens_per_chunk=3)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, g.client() as c:
        body = {**CHAT, "max_tokens": 8, "stream": True, "stream_options": options}
        r = await c.post("/v1/chat/completions", json=body)
    events = [orjson.loads(e.removeprefix("data: ")) for e in r.text.strip().split("\n\n")[:-1]]
    chunks = [e for e in events if e["choices"]]
    assert all(("usage" in e) is chunk_usage for e in chunks[1:])
    assert [e["usage"]["completion_tokens"] for e in events if not e["choices"]] == ([8] if final_usage else [])


async def test_idle_stream_times_out_with_error_event(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1, chunks=3, delay_s=1.0)
    async with serve_gateway(make_fleet([w.url]), make_tenants(), idle_timeout_s=0.2) as g, g.client() as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert _stream_error(r.text)["code"] == "upstream_timeout"


async def test_repeated_failures_eject_the_worker_through_the_store(upstreams: StartUpstreams) -> None:
    bad, good = await upstreams(2)
    bad.mode = Mode.HTTP_500
    fleet = make_fleet([bad.url, good.url])
    async with serve_gateway(fleet, make_tenants(), eject_after_failures=2, eject_for_s=60) as g, g.client() as c:
        for _ in range(30):
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
            if len(bad.bodies) >= 2:
                break
        ejected = await g.store.ejected(now=g.gw.clock.wall())
        assert set(ejected) == {"w0"}
        tried = len(bad.bodies)
        for _ in range(5):
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert len(bad.bodies) == tried


async def test_client_disconnect_cancels_the_upstream_stream(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1, chunks=200, delay_s=0.02)
    tenants = make_tenants(alpha={"max_concurrency": 1})
    async with serve_gateway(make_fleet([w.url]), tenants) as g:
        async with g.client() as c:
            body = {"model": MODEL, "messages": CHAT["messages"], "stream": True}
            async with c.stream("POST", "/v1/chat/completions", json=body) as s:
                async for _ in s.aiter_bytes():
                    break
        async with asyncio.timeout(5):
            await w.abandoned_event.wait()
        await g.gw.ledger.idle()
        records = (await g.store.usage("alpha", since=0, until=1e12)).records
        assert [r.status for r in records] == ["cancelled"]
        assert g.gw.pool.views["w0"].in_flight == 0
        async with g.client() as c:  # the concurrency slot was released
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
async def test_client_disconnect_before_the_first_byte_cancels_the_upstream(
    upstreams: StartUpstreams, stream: bool
) -> None:
    (w,) = await upstreams(1, mode=Mode.HANG)
    tenants = make_tenants(alpha={"max_concurrency": 1})
    async with serve_gateway(make_fleet([w.url]), tenants, first_byte_timeout_s=30, request_timeout_s=30) as g:
        async with g.client(timeout=0.3) as c:
            with pytest.raises(httpx.ReadTimeout):
                await c.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        async with asyncio.timeout(5):
            await w.abandoned_event.wait()
        w.mode = Mode.OK
        async with g.client() as c:  # the slot and the worker's in-flight count were released
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert g.gw.pool.views["w0"].in_flight == 0
