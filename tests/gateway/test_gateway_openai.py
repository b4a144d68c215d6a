"""The official ``openai`` client (sync and async, streaming and not) through a real gateway in front of two
real simulated workers on loopback; and ``gearshift up``'s printed client snippet, run as pasted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import openai
import pytest
import yaml
from openai.types.chat import ChatCompletionMessageParam

from bench.procs import free_port
from fleet.config import CommonSettings
from gearshift.cli.up import DEMO_KEY, banner, build_components, gateway_components, run_components
from workers.sim.server import SimServer
from workers.sim.settings import SimWorkerSettings

from .harness import KEYS, MODEL, RunningGateway, make_fleet, make_tenants, serve_gateway

SPEEDUP = 500.0
"""Simulated seconds per real second: a 32-token answer takes milliseconds."""
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something."}]


@pytest.fixture
async def gateway() -> AsyncIterator[RunningGateway]:
    """A gateway in front of two simulated workers (priority scheduling, so the tiers' priorities apply)."""
    sims = [
        SimServer(SimWorkerSettings(worker_id=f"w{i}", port=0, model=MODEL, speedup=SPEEDUP, seed=i)) for i in range(2)
    ]
    for sim in sims:
        await sim.start()
    try:
        tenants = make_tenants(alpha={"rpm": 1000})
        async with serve_gateway(make_fleet([s.url for s in sims]), tenants) as g:
            yield g
    finally:
        for sim in sims:
            await sim.stop()


def sync_client(g: RunningGateway, tenant: str = "alpha") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{g.url}/v1", api_key=KEYS[tenant], max_retries=0, timeout=10)


def async_client(g: RunningGateway, tenant: str = "alpha") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{g.url}/v1", api_key=KEYS[tenant], max_retries=0, timeout=10)


def _sync_calls(g: RunningGateway) -> tuple[openai.types.chat.ChatCompletion, str, int]:
    with sync_client(g) as client:
        whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16)
        stream = client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage_tokens = "", 0
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage is not None:
                usage_tokens = chunk.usage.completion_tokens
        return whole, text, usage_tokens


async def test_sync_client_streaming_and_not(gateway: RunningGateway) -> None:
    whole, text, usage_tokens = await asyncio.to_thread(_sync_calls, gateway)
    assert whole.choices[0].message.content
    assert whole.usage is not None
    assert whole.usage.completion_tokens == 16
    assert text
    assert usage_tokens == 24


async def test_async_client_streaming_and_not(gateway: RunningGateway) -> None:
    async with async_client(gateway, "beta") as client:
        whole = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8)
        assert whole.usage is not None
        assert whole.usage.completion_tokens == 8
        stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20, stream=True)
        chunks = [chunk async for chunk in stream]
    assert all(c.usage is None for c in chunks), "the forced usage chunk is stripped when not asked for"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    await gateway.gw.ledger.idle()
    usage = await gateway.store.usage("beta", since=0, until=1e12)
    assert [r.completion_tokens for r in usage.records] == [8, 20]
    assert all(r.worker_id in {"w0", "w1"} for r in usage.records)


async def test_concurrent_async_streams_spread_over_both_workers(gateway: RunningGateway) -> None:
    async with async_client(gateway) as client:

        async def one() -> str:
            stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=32, stream=True)
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        texts = await asyncio.gather(*(one() for _ in range(8)))
    assert all(texts)
    await gateway.gw.ledger.idle()
    records = (await gateway.store.usage("alpha", since=0, until=1e12)).records
    assert {r.worker_id for r in records} == {"w0", "w1"}


async def test_errors_map_to_the_clients_exceptions(gateway: RunningGateway) -> None:
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="sk-nope", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            await bad.models.list()
    async with async_client(gateway, "gamma") as client:
        with pytest.raises(openai.PermissionDeniedError):
            await client.chat.completions.create(model=MODEL, messages=MESSAGES)
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="nope", messages=MESSAGES)
        assert [m.id async for m in client.models.list()] == ["other-model"]


async def test_up_prints_a_snippet_that_works_as_pasted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = {
        "models": [{"name": MODEL}],
        "workers": [{"id": f"sim-{i}", "url": f"http://127.0.0.1:{free_port()}", "model": MODEL} for i in range(2)],
    }
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    monkeypatch.setenv("GEARSHIFT_PORT", "0")
    settings = CommonSettings(fleet_file=tmp_path / "fleet.yaml")
    components = [*build_components(settings, speedup=SPEEDUP), *gateway_components(settings)]
    stop = asyncio.Event()
    printed: list[str] = []

    async def paste_snippet() -> None:
        text = banner(components, settings)
        snippet = text[text.index("from openai import OpenAI") : text.index("print()") + len("print()")]
        assert DEMO_KEY in snippet
        await asyncio.to_thread(exec, snippet, {"print": lambda *a, **k: printed.append("".join(map(str, a)))})
        stop.set()

    started = asyncio.Event()
    runner = asyncio.create_task(run_components(components, stop, on_started=lambda _: started.set()))
    async with asyncio.timeout(30):
        await started.wait()
        await paste_snippet()
        await runner
    assert "".join(printed).strip()


async def test_models_retrieve_serves_only_the_models_a_tenant_may_use(gateway: RunningGateway) -> None:
    async with async_client(gateway) as client:
        model = await client.models.retrieve(MODEL)
        assert (model.id, model.object, model.owned_by) == (MODEL, "model", "gearshift")
        assert model.model_dump() == (await client.models.list()).data[0].model_dump()
        with pytest.raises(openai.NotFoundError) as missing:
            await client.models.retrieve("no-such-model")
    async with async_client(gateway, "gamma") as client:
        with pytest.raises(openai.NotFoundError) as hidden:
            await client.models.retrieve(MODEL)
    for error in (missing.value, hidden.value):
        body = error.response.json()
        await _conforms(gateway, body)
        assert {k: v for k, v in body["error"].items() if k != "message"} == {
            "type": "invalid_request_error", "param": "model", "code": "model_not_found",
        }  # fmt: skip
    assert "/v1/models/{model}" in (await _openapi(gateway))["paths"]


WORKER_400S = [
    ("/v1/chat/completions", {"model": MODEL, "messages": [{}]}, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "stream_options": {}}, "stream_options"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
]


@pytest.mark.parametrize(("path", "body", "param"), WORKER_400S)
async def test_a_workers_error_takes_the_gateways_error_shape(
    gateway: RunningGateway, path: str, body: dict[str, object], param: str
) -> None:
    sim = gateway.gw.fleet.workers[0].url
    async with httpx.AsyncClient() as direct, gateway.client() as c:
        worker = (await direct.post(sim + path, json=body)).json()["error"]
        r = await c.post(path, json=body)
    assert worker["code"] == 400, "the simulator answers like vLLM: an integer code"
    assert r.status_code == 400
    await _conforms(gateway, r.json())
    error = r.json()["error"]
    assert error["message"] == worker["message"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] is None
    assert error["param"] is None or error["param"].startswith(param)


async def _openapi(g: RunningGateway) -> dict[str, Any]:
    async with g.client(None) as c:
        return dict((await c.get("/openapi.json")).json())


async def _conforms(g: RunningGateway, body: dict[str, Any]) -> None:
    """``body`` is valid under the gateway's own OpenAPI ``ErrorBody`` schema."""
    document = await _openapi(g)
    schema = {"$ref": "#/components/schemas/ErrorBody", "components": document["components"]}
    jsonschema_rs.validate(schema, body)


async def test_the_openapi_examples_are_requests_that_succeed(gateway: RunningGateway) -> None:
    """A client generator or fuzzer reading the document has one request per completion operation that works."""
    paths = (await _openapi(gateway))["paths"]
    async with gateway.client() as c:
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
            example = paths[path]["post"]["requestBody"]["content"]["application/json"]["example"]
            assert example["model"] == MODEL
            r = await c.post(path, json=example)
            assert r.status_code == 200, r.text
