"""The admission estimate of agentic requests (tool schemas, earlier tool calls and their results, image parts, the
Responses API's body: each adds what the chat template renders, so a tenant cannot pass its TPM with them), and the
Responses API's stream meter."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest

from fleet.config import TierConfig
from gateway.errors import InvalidRequest, UpstreamFailed
from gateway.intake.brownout import cap_max_tokens
from gateway.upstream.body import parse_completion
from gateway.upstream.responses import ResponsesStreamMeter, error_event, parse_responses
from gateway.upstream.sse import Usage
from gateway.usage.metrics import GatewayMetrics

from .harness import body_rules

RULES = body_rules(chars_per_token=4, tokens_per_message=4, tokens_per_image=700, default_max_tokens=64)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city, today and for the next days.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CALLS = [{"id": "call-1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]
ASK = {"role": "user", "content": "Weather in Paris?"}


def chat(messages: list[Any], **extra: Any) -> int:
    body = {"model": "m", "messages": messages, "max_tokens": 10, **extra}
    return parse_completion(orjson.dumps(body), prompt_field="messages", rules=RULES).prompt_tokens


def chars_tokens(obj: object) -> int:
    return math.ceil(len(orjson.dumps(obj)) / RULES.chars_per_token)


def test_tool_schemas_count_as_their_json() -> None:
    assert chat([ASK], tools=TOOLS) == chat([ASK]) + chars_tokens(TOOLS)


def test_an_earlier_tool_call_and_its_result_count() -> None:
    call = {"role": "assistant", "content": None, "tool_calls": CALLS}
    result = {"role": "tool", "tool_call_id": "call-1", "content": "18 C and sunny, light wind from the west"}
    empty_turns = chat([ASK, {"role": "assistant", "content": None}, {"role": "tool", "content": ""}])
    with_calls = chat([ASK, call, result])
    # the same three messages, now holding the call's JSON and the result's text
    assert with_calls - empty_turns == chars_tokens(CALLS) - 1 + math.ceil(len(result["content"]) / 4) - 1


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "input_image", "image_url": "https://example.com/a.png"},
    ],
)
def test_each_image_part_counts_tokens_per_image(part: dict[str, Any]) -> None:
    text = {"type": "text", "text": "What is in these pictures?"}
    one = chat([{"role": "user", "content": [text, part]}])
    two = chat([{"role": "user", "content": [text, part, part]}])
    none = chat([{"role": "user", "content": [text]}])
    assert (one - none, two - none) == (RULES.tokens_per_image, 2 * RULES.tokens_per_image)


def responses(**body: Any) -> Any:
    return parse_responses(orjson.dumps({"model": "m", **body}), rules=RULES)


def test_a_responses_body_estimates_like_the_same_chat() -> None:
    req = responses(input=[ASK], instructions="Be brief.", tools=TOOLS, max_output_tokens=10)
    same = chat([{"role": "system", "content": "Be brief."}, ASK], tools=TOOLS)
    assert req.prompt_tokens == same
    assert req.reserved_tokens == same + 10
    assert responses(input="Weather in Paris?").prompt_tokens == chat([ASK])
    assert responses(input="hi").reserved_tokens == responses(input="hi").prompt_tokens + RULES.default_max_tokens


def test_a_responses_stream_is_sent_without_stream_options() -> None:
    req = responses(input="hi", stream=True)
    assert "stream_options" not in orjson.loads(req.upstream_body(priority=2))
    chat_req = parse_completion(b'{"model":"m","stream":true,"prompt":"hi"}', prompt_field="prompt", rules=RULES)
    assert "stream_options" in orjson.loads(chat_req.upstream_body(priority=2))


def test_the_brownout_caps_max_output_tokens_of_a_responses_request() -> None:
    req = responses(input="hi", max_output_tokens=500)
    assert cap_max_tokens(req, TierConfig(brownout_max_tokens=50), default_max_tokens=64)
    body = orjson.loads(req.upstream_body(priority=None))
    assert body["max_output_tokens"] == 50
    assert "max_tokens" not in body
    assert req.reserved_tokens == req.prompt_tokens + 50


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({}, "input"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "hi", "stream": "yes"}, "stream"),
        ({"input": "hi", "model": ""}, "model"),
    ],
)
def test_a_bad_responses_body_is_a_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_responses(orjson.dumps({"model": "m", **body}), rules=RULES)
    assert refused.value.param == param


def sse(kind: str, **data: Any) -> bytes:
    return f"event: {kind}\ndata: ".encode() + orjson.dumps({"type": kind, **data}) + b"\n\n"


def test_the_responses_meter_passes_events_as_bytes_and_meters_the_terminal_usage() -> None:
    usage = {"input_tokens": 9, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 4}}
    stream = b"".join(
        [
            sse("response.created", response={"usage": None}),
            *(sse("response.output_text.delta", delta=w) for w in ("a", "b", "c")),
            sse("response.completed", response={"usage": usage}),
        ]
    )
    meter = ResponsesStreamMeter()
    out = b"".join(meter.feed(stream[i : i + 7], now=float(i)) for i in range(0, len(stream), 7))
    assert out == stream  # nothing rewritten, nothing held back at the end
    assert meter.done
    assert meter.chunk_events == 3  # the output deltas, not the created event
    assert meter.first_token_at is not None
    assert meter.first_token_at > 0.0  # timed on the first delta, after the created event
    assert meter.usage == Usage(9, 3, 4)


def test_a_responses_stream_cut_short_is_metered_by_its_deltas_and_ends_with_an_error_event() -> None:
    meter = ResponsesStreamMeter()
    meter.feed(sse("response.created") + sse("response.output_text.delta", delta="a"), now=1.0)
    assert not meter.done
    assert meter.usage is None
    assert meter.completion_tokens == 1  # a lower bound: one engine step's tokens per delta
    metrics = GatewayMetrics()
    event = error_event(UpstreamFailed("worker w0 died", request_id="req-1"), metrics)
    kind, data = event.split(b"\n", 1)
    assert kind == b"event: error"
    body = orjson.loads(data.removeprefix(b"data: "))
    assert body["type"] == "error"
    assert body["code"] == "upstream_failed"
    assert "req-1" in body["message"]
