"""Agentic requests through a real gateway in front of a real simulated worker, with the official ``openai`` client:
tool calls streamed and not (the deltas reassemble to the call), the Responses API streamed and not, each request
metered once in the ledger with the worker's usage; and a worker without ``/v1/responses`` answers in the OpenAI
error shape."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from aiohttp import web
from openai.types.chat import ChatCompletionMessageFunctionToolCall

from bench.procs import free_port
from fleet.store.protocol import UsageRecord
from workers.sim.server import SimServer
from workers.sim.settings import SimWorkerSettings

from .harness import KEYS, MODEL, RunningGateway, eventually, make_fleet, make_tenants, serve_gateway

SPEEDUP = 500.0
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK: Any = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture
async def gateway() -> AsyncIterator[RunningGateway]:
    sim = SimServer(SimWorkerSettings(worker_id="w0", port=0, model=MODEL, speedup=SPEEDUP, seed=0))
    await sim.start()
    try:
        async with serve_gateway(make_fleet([sim.url]), make_tenants(alpha={"rpm": 1000})) as g:
            yield g
    finally:
        await sim.stop()


def client(g: RunningGateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{g.url}/v1", api_key=KEYS["alpha"], max_retries=0, timeout=10)


async def record_of(g: RunningGateway, request_id: str) -> UsageRecord:
    """The one ledger record of ``request_id`` (waits for the background writer)."""

    async def landed() -> bool:
        return any(r.request_id == request_id for r in await g.store.ledger(since=0.0, until=1e12))

    await eventually(landed, timeout_s=5.0)
    records = [r for r in await g.store.ledger(since=0.0, until=1e12) if r.request_id == request_id]
    assert len(records) == 1
    return records[0]


async def test_a_streamed_tool_call_reassembles_through_the_gateway_and_is_metered_once(
    gateway: RunningGateway,
) -> None:
    async with client(gateway) as c:
        whole_raw = await c.chat.completions.with_raw_response.create(
            model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=100
        )
        whole = whole_raw.parse()
        raw = await c.chat.completions.with_raw_response.create(
            model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=100, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        name, arguments, finish, usage = None, "", None, None
        async for chunk in raw.parse():
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                for tc in choice.delta.tool_calls or []:
                    assert tc.function is not None
                    name = tc.function.name or name
                    arguments += tc.function.arguments or ""
                finish = choice.finish_reason or finish
    assert whole.choices[0].finish_reason == finish == "tool_calls"
    calls = whole.choices[0].message.tool_calls
    assert calls is not None
    call = calls[0]
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert (name, arguments) == (call.function.name, call.function.arguments)
    assert name == "get_weather"
    assert set(json.loads(arguments)) == {"city"}
    assert usage is not None
    assert whole.usage is not None
    streamed = await record_of(gateway, raw.headers["x-request-id"])
    unstreamed = await record_of(gateway, whole_raw.headers["x-request-id"])
    assert (streamed.prompt_tokens, streamed.completion_tokens) == (usage.prompt_tokens, usage.completion_tokens)
    assert (unstreamed.prompt_tokens, unstreamed.completion_tokens) == (
        whole.usage.prompt_tokens,
        whole.usage.completion_tokens,
    )
    assert streamed.completion_tokens == unstreamed.completion_tokens > 0
    assert streamed.ttft_s is not None
    assert streamed.status == unstreamed.status == "ok"


async def test_responses_api_streamed_and_not_through_the_gateway_is_metered_in_tokens(
    gateway: RunningGateway,
) -> None:
    async with client(gateway) as c:
        whole_raw = await c.responses.with_raw_response.create(
            model=MODEL, input="Tell me about gears.", max_output_tokens=24, temperature=0
        )
        whole = whole_raw.parse()
        raw = await c.responses.with_raw_response.create(
            model=MODEL, input="Tell me about gears.", max_output_tokens=24, temperature=0, stream=True
        )
        events = [event async for event in raw.parse()]
    assert whole.usage is not None
    assert whole.usage.output_tokens == 24
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    completed = events[-1]
    assert completed.type == "response.completed"
    assert completed.response.usage is not None
    for raw_response, usage in ((whole_raw, whole.usage), (raw, completed.response.usage)):
        record = await record_of(gateway, raw_response.headers["x-request-id"])
        assert (record.prompt_tokens, record.completion_tokens) == (usage.input_tokens, usage.output_tokens)
        assert record.status == "ok"
    streamed = await record_of(gateway, raw.headers["x-request-id"])
    assert streamed.ttft_s is not None
    assert streamed.tpot_s is not None


async def test_responses_api_keeps_the_gateways_auth_and_limits(gateway: RunningGateway) -> None:
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="wrong", max_retries=0, timeout=10) as bad:
        with pytest.raises(openai.AuthenticationError):
            await bad.responses.create(model=MODEL, input="hi")
    async with client(gateway) as c:
        with pytest.raises(openai.NotFoundError):
            await c.responses.create(model="no-such-model", input="hi")
        with pytest.raises(openai.BadRequestError) as refused:
            await c.responses.create(model=MODEL, input=[])
    assert refused.value.body is not None
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["param"] == "input"


@pytest.fixture
async def plain_worker() -> AsyncIterator[str]:
    """A worker that serves chat completions and nothing else (aiohttp's plain-text 404 for other routes)."""

    async def health(_: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_worker_without_the_responses_api_answers_an_openai_error(plain_worker: str) -> None:
    async with serve_gateway(make_fleet([plain_worker]), make_tenants()) as g, g.client() as c:
        r = await c.post("/v1/responses", json={"model": MODEL, "input": "hi"})
    assert r.status_code == 404
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "not_found_error"


def vllm_agentic_stream() -> list[dict[str, Any]]:
    """A vLLM 0.32 stream with a reasoning parser and a tool parser (shapes from its ``chat_completion/serving.py``
    and ``DeltaMessage``): the role, two reasoning deltas, the tool call's opening and argument deltas, the finish,
    each with its running usage (``continuous_usage_stats``), then the usage chunk."""
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    opening = {"id": "chatcmpl-tool-1", "type": "function", "index": 0}
    deltas: list[tuple[dict[str, Any], str | None]] = [
        ({"role": "assistant", "content": ""}, None),
        ({"reasoning": "The user wants"}, None),
        ({"reasoning": " the weather."}, None),
        ({"tool_calls": [{**opening, "function": {"name": "get_weather", "arguments": '{"city": '}}]}, None),
        ({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}, None),
        ({}, "tool_calls"),
    ]
    chunks = []
    for tokens, (delta, finish) in enumerate(deltas):
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        usage = {"prompt_tokens": 20, "total_tokens": 20 + 2 * tokens, "completion_tokens": 2 * tokens}
        chunks.append({**head, "choices": [choice], "usage": usage})
    usage = {"prompt_tokens": 20, "total_tokens": 30, "completion_tokens": 10}
    return [*chunks, {**head, "choices": [], "usage": usage}]


@pytest.fixture
async def scripted_worker() -> AsyncIterator[str]:
    """A worker that answers every chat stream with ``vllm_agentic_stream``."""

    async def health(_: web.Request) -> web.Response:
        return web.json_response({})

    async def chat(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in vllm_agentic_stream():
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_reasoning_and_tool_call_deltas_pass_unchanged_and_are_metered(scripted_worker: str) -> None:
    body = {"model": MODEL, "messages": ASK, "tools": [WEATHER], "stream": True}
    async with serve_gateway(make_fleet([scripted_worker]), make_tenants()) as g, g.client() as c:
        async with c.stream("POST", "/v1/chat/completions", json=body) as r:
            events = [line[6:] async for line in r.aiter_lines() if line.startswith("data: ")]
            request_id = r.headers["x-request-id"]
        record = await record_of(g, request_id)
    assert events[-1] == "[DONE]"
    sent = [{k: v for k, v in chunk.items() if k != "usage"} for chunk in vllm_agentic_stream()[:-1]]
    assert [json.loads(e) for e in events[:-1]] == sent  # the client asked for no usage: only that is removed
    assert (record.prompt_tokens, record.completion_tokens) == (20, 10)
