"""Agentic requests on the simulated worker, through the official ``openai`` client: tool calls (streamed as vLLM
0.32 streams them, and not), tool-choice errors, and the Responses API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall
from openai.types.chat.chat_completion_message_function_tool_call import Function

MODEL = "kimi-k3"
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1},
            },
            "required": ["city"],
        },
    },
}
CLOCK: Any = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]


def function_of(call: object) -> Function:
    """The function of a message's tool call (the simulator makes function calls only)."""
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    return call.function


@pytest.fixture
def client(sim_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{sim_url}/v1", api_key="unused", max_retries=0, timeout=30) as client:
        yield client


def test_auto_tool_choice_calls_the_first_tool_with_arguments_that_fit_its_schema(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, CLOCK], max_tokens=200)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None
    assert len(calls) == 1
    call = function_of(calls[0])
    assert call.name == "get_weather"
    args = json.loads(call.arguments)
    assert set(args) == {"city", "unit", "days"}
    assert isinstance(args["city"], str)
    assert args["unit"] == "celsius"
    assert args["days"] >= 1
    assert resp.usage is not None
    assert resp.usage.completion_tokens == -(-len(call.arguments) // 4)  # CHARS_PER_TOKEN a token


def test_a_streamed_tool_call_reassembles_to_the_unstreamed_one(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=200)
    stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=200, stream=True)
    first: list[Any] = []
    arguments, finish = [], None
    for chunk in stream:
        delta = chunk.choices[0].delta
        for tc in delta.tool_calls or []:
            assert tc.index == 0
            if tc.id is not None:
                first.append(tc)
            assert tc.function is not None
            arguments.append(tc.function.arguments or "")
        finish = chunk.choices[0].finish_reason or finish
    assert len(first) == 1  # the id, type and name come once, on the first delta
    assert first[0].type == "function"
    assert first[0].function.name == "get_weather"
    assert len(arguments) > 1  # the arguments stream over several engine steps
    assert whole.choices[0].message.tool_calls is not None
    assert "".join(arguments) == function_of(whole.choices[0].message.tool_calls[0]).arguments
    assert finish == "tool_calls"


def test_named_tool_choice_calls_that_tool_and_finishes_with_stop(client: openai.OpenAI) -> None:
    named: Any = {"type": "function", "function": {"name": "get_time"}}
    resp = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, CLOCK], tool_choice=named)
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.tool_calls is not None
    function = function_of(choice.message.tool_calls[0])
    assert (function.name, function.arguments) == (
        "get_time",
        "{}",
    )


def test_after_a_tool_result_auto_answers_with_text_and_the_tools_count_as_prompt(client: openai.OpenAI) -> None:
    call = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=200)
    assert call.choices[0].message.tool_calls is not None
    turn = call.choices[0].message.tool_calls[0]
    history: list[Any] = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [turn.model_dump()]},
        {"role": "tool", "tool_call_id": turn.id, "content": "18 C, sunny"},
    ]
    answer = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=12)
    assert answer.choices[0].finish_reason == "length"
    assert answer.choices[0].message.content
    assert not answer.choices[0].message.tool_calls
    plain = client.chat.completions.create(model=MODEL, messages=history, max_tokens=1)
    assert answer.usage is not None
    assert plain.usage is not None
    assert call.usage is not None
    schema_tokens = -(-len(json.dumps([WEATHER], separators=(",", ":"))) // 4)
    assert answer.usage.prompt_tokens == plain.usage.prompt_tokens + schema_tokens
    assert plain.usage.prompt_tokens > call.usage.prompt_tokens - schema_tokens  # the call and its result count


def test_max_tokens_cuts_a_tool_call_short_with_length(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=2)
    choice = resp.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.tool_calls is not None
    assert len(function_of(choice.message.tool_calls[0]).arguments) == 8


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": []}, "tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ],
)
def test_a_bad_tool_choice_is_vllms_400(http: httpx.Client, sim_url: str, extra: dict[str, Any], param: str) -> None:
    resp = http.post(f"{sim_url}/v1/chat/completions", json={"model": MODEL, "messages": ASK, **extra})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == param


def test_responses_api_answers_text_with_input_and_output_tokens(client: openai.OpenAI) -> None:
    resp = client.responses.create(model=MODEL, input="Tell me about gears.", max_output_tokens=20)
    assert resp.status == "incomplete"
    assert resp.object == "response"
    assert resp.output_text
    assert resp.usage is not None
    assert resp.usage.output_tokens == 20
    assert resp.usage.total_tokens == resp.usage.input_tokens + 20
    longer = client.responses.create(
        model=MODEL, input="Tell me about gears.", instructions="Answer briefly.", max_output_tokens=20
    )
    assert longer.usage is not None
    assert longer.usage.input_tokens > resp.usage.input_tokens


def test_streamed_response_events_deliver_the_same_text_and_usage(client: openai.OpenAI) -> None:
    ask: dict[str, Any] = {"model": MODEL, "input": "Tell me about gears.", "max_output_tokens": 30, "temperature": 0}
    whole = client.responses.create(**ask)
    events = list(client.responses.create(**ask, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1
    assert "".join(deltas) == whole.output_text
    completed = events[-1]
    assert completed.type == "response.completed"
    assert completed.response.usage is not None
    assert whole.usage is not None
    assert completed.response.usage.output_tokens == whole.usage.output_tokens == 30
