"""OpenAI's Responses API (``POST /v1/responses``) through the gateway: the same pipeline as a chat completion
(auth, limits, routing, metering, errors), with the Responses API's body and event stream.

**Body.** ``model``, ``stream``, ``max_output_tokens`` and the prompt are read: ``instructions`` and every
``input`` item (a string, messages with text or image parts, function calls and their outputs) count as chat
messages, ``tools`` as their schema JSON (``gateway.upstream.body.estimate``). Nothing is added for usage: the Responses
API has no ``stream_options``, and its last event carries the usage.

**Stream.** The worker sends ``event: TYPE`` / ``data: JSON`` pairs and ends the body after
``response.completed`` (also sent, with status ``incomplete``, when ``max_output_tokens`` cut the answer; or
``response.failed`` / ``error``) — there is no ``[DONE]``, and the gateway adds none. Events pass through as
bytes; the meter reads the type of each, times the first and last output delta (TTFT, TPOT) and takes the usage
(``input_tokens``, ``output_tokens``, ``input_tokens_details.cached_tokens``) from the terminal event. A stream cut
short before it is metered by its output delta events, a lower bound on its tokens (a delta carries one engine
step's tokens, up to k + 1 under speculation). A failure after the stream started is sent as the API's own
``error`` event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import GatewayError, InvalidRequest, count
from gateway.upstream.body import BodyRules, CompletionRequest, body_head, count_images, estimate, schema_chars
from gateway.upstream.sse import StreamMeter, usage_of
from gateway.usage.metrics import GatewayMetrics

TERMINAL_EVENTS = frozenset({b"response.completed", b"response.incomplete", b"response.failed", b"error"})
"""Event types after which a worker ends a Responses stream."""
OUTPUT_DELTA_EVENTS = frozenset(
    {b"response.output_text.delta", b"response.reasoning_text.delta", b"response.function_call_arguments.delta"}
)
"""Event types that carry generated tokens (the ones TTFT and TPOT are timed on)."""


def _item_chars(item: object) -> int:
    """Characters of one ``input`` item: a message's text parts, a function call's name and arguments, or a
    function output."""
    if isinstance(item, str):
        return len(item)
    if not isinstance(item, dict):
        return 0
    content = item.get("content")
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(str(p.get("text", ""))) for p in content if isinstance(p, dict))
    return sum(len(str(item.get(key, ""))) for key in ("name", "arguments", "output"))


def parse_responses(raw: bytes, *, rules: BodyRules) -> CompletionRequest:
    """Parse a Responses API body and estimate its tokens (400 for a body it cannot be)."""
    body, model = body_head(raw)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequest(f"'stream' must be a boolean, got {stream!r}.", param="stream")
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        message = f"'max_output_tokens' must be a positive integer, got {max_tokens!r}."
        raise InvalidRequest(message, param="max_output_tokens")
    items = body.get("input")
    if isinstance(items, str):
        items = [items]
    if not isinstance(items, list) or not items:
        raise InvalidRequest("'input' is required: a string or a non-empty list of items.", param="input")
    if len(items) > rules.max_messages:
        raise InvalidRequest(f"'input' has {len(items)} items; the limit is {rules.max_messages}.", param="input")
    instructions = body.get("instructions")
    parts = tuple(_item_chars(i) for i in items)
    if isinstance(instructions, str) and instructions:
        parts = (len(instructions), *parts)
    prompt, reserved = estimate(
        parts, chat=True, max_tokens=max_tokens, choices=1, rules=rules, images=count_images(items),
        schema=schema_chars(body),
    )  # fmt: skip
    return CompletionRequest(
        body=body, model=model, stream=stream, client_wants_usage=True, client_wants_chunk_usage=False,
        max_tokens=max_tokens, prompt_parts=parts, chat=True, prompt_tokens=prompt, reserved_tokens=reserved,
        max_tokens_field="max_output_tokens", usage_options=False,
    )  # fmt: skip


def _event_type(event: bytes) -> bytes | None:
    """The ``event:`` field of one SSE event, if it has one."""
    if not event.startswith(b"event:"):
        return None
    end = event.find(b"\n")
    return event[6 : end if end >= 0 else None].strip()


def _data(event: bytes) -> Any:
    at = event.find(b"data:")
    if at < 0:
        return None
    try:
        return orjson.loads(event[at + 5 :])
    except orjson.JSONDecodeError:
        return None


@dataclass(slots=True)
class ResponsesStreamMeter(StreamMeter):
    """Reads a Responses API event stream as it passes (see the module docstring); ``done`` at its terminal
    event, which is forwarded (unlike a chat stream's ``[DONE]``)."""

    strip_usage: bool = False

    def feed(self, chunk: bytes, now: float) -> bytes:
        complete = self._complete_events(chunk)
        for event in complete.split(b"\n\n")[:-1]:
            kind = _event_type(event)
            if kind in OUTPUT_DELTA_EVENTS:
                self._count_chunks(1, now)
            elif kind in TERMINAL_EVENTS:
                self.done = True
                obj = _data(event)
                self.usage = usage_of(obj.get("response") if isinstance(obj, dict) else None) or self.usage
        return complete

    def end(self, error: GatewayError | None, metrics: GatewayMetrics) -> bytes:
        """No ``[DONE]``: the worker's terminal event ended the stream; a failure is the API's ``error`` event."""
        return b"" if error is None else error_event(error, metrics)


def error_event(exc: GatewayError, metrics: GatewayMetrics) -> bytes:
    """A failure after a Responses stream started, as the API's ``error`` event; logged and counted like every
    error (``gateway.errors.count``)."""
    count(exc, metrics)
    event = {"type": "error", "code": exc.code or exc.type, "message": exc.message, "param": exc.param}
    return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"
