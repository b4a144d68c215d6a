"""Tool calls of the simulated worker: which tool a chat request calls, with what arguments, and how vLLM 0.32
streams and returns the call.

The simulator calls a tool when the request forces one (``tool_choice`` ``"required"`` or a named function) and,
under ``"auto"`` (the default when ``tools`` are given), unless the last message is a tool result: an agent loop
then alternates call → result → answer, which is what an agentic benchmark needs. The tool is the named one, else
the first. Its arguments are deterministic JSON that fits the tool's JSON-schema ``parameters`` (``example_value``)
and are generated as tokens like any text: ``CHARS_PER_TOKEN`` characters a token, so ``max_tokens`` can cut a
call short (``finish_reason`` ``length``, as in vLLM).

Shapes, from vLLM 0.32 (``entrypoints/openai/chat_completion/serving.py``, ``tool_parsers/streaming.py``,
``generate/base/protocol.py``): the first streamed delta of a call carries ``id``, ``type``, ``index`` and
``function.name`` with the first arguments text, later deltas ``index`` and ``function.arguments`` only;
``finish_reason`` is ``tool_calls`` for ``auto``/``required`` and ``stop`` for a named function. A tool-choice
error is vLLM's 400 with the same message. Tool schemas and earlier calls are part of the rendered prompt, so
they count as prompt tokens (``tool_prompt_tokens``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

from workers.sim.errors import BadRequest
from workers.sim.text import CHARS_PER_TOKEN, text_seed

MAX_SCHEMA_DEPTH = 8
"""Nested objects and arrays deeper than this get ``null`` (a recursive schema must still end)."""


@dataclass(frozen=True, slots=True)
class PlannedCall:
    """The tool call a request will get."""

    name: str
    arguments: str
    """The whole arguments JSON (what the model would generate)."""
    call_id: str
    named: bool
    """The request named the function (``finish_reason`` ``stop`` rather than ``tool_calls``)."""

    @property
    def finish_reason(self) -> str:
        return "stop" if self.named else "tool_calls"


class ScriptedText:
    """A fixed output text given out ``CHARS_PER_TOKEN`` characters a token (the same interface as
    ``workers.sim.text.TextStream``); past its end, tokens are empty."""

    def __init__(self, text: str) -> None:
        self._pieces = [text[i : i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN)] or [""]
        self._at = 0

    @property
    def tokens(self) -> int:
        return len(self._pieces)

    def take(self, tokens: int) -> list[str]:
        pieces = self._pieces[self._at : self._at + tokens]
        self._at += tokens
        return pieces + [""] * (tokens - len(pieces))


def _function(tool: object, at: int) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise BadRequest(f"tools[{at}]: a function tool needs `function.name`.", param="tools")
    return function


def _named_choice(tool_choice: object) -> str | None:
    """The function a named ``tool_choice`` asks for; None for ``auto``/``required``; 400 otherwise."""
    if tool_choice in ("auto", "required"):
        return None
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str) and name:
            return name
        raise BadRequest(
            'Expected field `name` in `function` in `tool_choice`! Correct usage: `{"type": "function", '
            '"function": {"name": "my_function"}}`',
            param="tool_choice.function.name",
        )
    raise BadRequest(
        f'Invalid value for `tool_choice`: {tool_choice}! Only named tools, "none", "auto" or "required" are '
        "supported.",
        param="tool_choice",
    )


def plan_tool_call(
    tools: list[Any] | None, tool_choice: object, messages: list[dict[str, Any]], *, model: str
) -> PlannedCall | None:
    """The call a chat request gets (None: it answers with text), after vLLM's checks of ``tools`` and
    ``tool_choice`` (400 with vLLM's message)."""
    if tools is not None and not tools:
        message = "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely."
        raise BadRequest(message, param="tools")
    if tool_choice == "none" or (tool_choice is None and not tools):
        return None
    if not tools:
        raise BadRequest("When using `tool_choice`, `tools` must be set.", param="tool_choice")
    choice = "auto" if tool_choice is None else tool_choice
    functions = [_function(tool, i) for i, tool in enumerate(tools)]
    named = _named_choice(choice)
    if named is not None:
        function = next((f for f in functions if f["name"] == named), None)
        if function is None:
            message = "The tool specified in `tool_choice` does not match any of the specified `tools`"
            raise BadRequest(message, param="tool_choice")
    elif choice == "auto" and messages and messages[-1].get("role") == "tool":
        return None  # the tool answered: reply with text
    else:
        function = functions[0]
    arguments = orjson.dumps(example_value(function.get("parameters"), seed=text_seed(model, function["name"])))
    call_id = f"chatcmpl-tool-{text_seed(model, function['name'], len(messages)):016x}"
    return PlannedCall(function["name"], arguments.decode(), call_id, named=named is not None)


def example_value(schema: object, *, seed: int, depth: int = 0) -> Any:
    """A deterministic value that fits a JSON schema: its ``const``, first ``enum`` value or ``default``; else by
    ``type`` — every property of an object (required or not), one item of an array, a short string, 1, 1.0,
    true; ``null`` beyond ``MAX_SCHEMA_DEPTH`` or for a schema it cannot read."""
    if not isinstance(schema, dict) or depth > MAX_SCHEMA_DEPTH:
        return None
    for key in ("const", "default"):
        if key in schema:
            return schema[key]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return example_value(schema[key][0], seed=seed, depth=depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and isinstance(schema.get("properties"), dict)):
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            return {}
        return {
            name: example_value(sub, seed=text_seed(seed, name), depth=depth + 1) for name, sub in properties.items()
        }
    if kind == "array":
        return [example_value(schema.get("items"), seed=seed, depth=depth + 1)]
    if kind == "string":
        return f"v{seed % 10_000:04d}"
    if kind == "integer":
        return max(1, int(schema.get("minimum", 1)))
    if kind == "number":
        return float(schema.get("minimum", 1.0))
    if kind == "boolean":
        return True
    return None


def tool_prompt_tokens(tools: list[Any] | None, messages: list[dict[str, Any]]) -> int:
    """Prompt tokens the chat template adds for the tool schemas and the earlier calls in the messages
    (assistant ``tool_calls``): their JSON at ``CHARS_PER_TOKEN`` characters a token."""
    chars = len(orjson.dumps(tools)) if tools else 0
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            chars += len(orjson.dumps(calls))
    return math.ceil(chars / CHARS_PER_TOKEN)


def first_delta(call: PlannedCall, arguments: str) -> dict[str, Any]:
    """The streamed delta that opens the call (vLLM's ``extract_named_tool_call_streaming`` shape)."""
    function = {"name": call.name, "arguments": arguments}
    return {"tool_calls": [{"id": call.call_id, "type": "function", "index": 0, "function": function}]}


def next_delta(arguments: str) -> dict[str, Any]:
    """A later streamed delta of the call: more of its arguments."""
    return {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}


def message_calls(call: PlannedCall, arguments: str) -> list[dict[str, Any]]:
    """The ``tool_calls`` of a non-streamed message."""
    return [{"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": arguments}}]


class ChatRendering:
    """A chat choice's deltas, finish reason and message: text content, or the planned tool call (``call``)."""

    def __init__(self, call: PlannedCall | None) -> None:
        self.call = call
        self._opened: set[int] = set()

    def delta(self, index: int, text: str) -> dict[str, Any]:
        """The streamed ``delta`` of choice ``index`` for a step that gave ``text``."""
        if self.call is None:
            return {"content": text}
        if index in self._opened:
            return next_delta(text)
        self._opened.add(index)
        return first_delta(self.call, text)

    def finish_reason(self, reason: str | None) -> str | None:
        """vLLM's finish reason: a completed call ends with ``tool_calls`` (``stop`` for a named function)."""
        return self.call.finish_reason if self.call is not None and reason == "stop" else reason

    def message(self, text: str) -> dict[str, Any]:
        """The non-streamed ``message`` as vLLM 0.32 serialises its ``ChatMessage`` (``tool_calls`` only when
        there are some; vLLM's ``reasoning`` field, null without a reasoning parser)."""
        message: dict[str, Any] = {
            "role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
            "function_call": None, "reasoning": None,
        }  # fmt: skip
        if self.call is not None:
            message["content"] = "" if self.call.named else None
            message["tool_calls"] = message_calls(self.call, text)
        return message
