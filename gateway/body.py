"""Reading and rewriting a completion request body.

The body is parsed once with orjson; only ``model``, ``stream``, ``stream_options``, ``max_tokens`` /
``max_completion_tokens`` and ``priority`` are read or changed. Every other field passes to the worker
untouched. No pydantic model of the whole body is built on the hot path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import InvalidRequest


@dataclass(slots=True)
class CompletionRequest:
    """A parsed request: the fields the gateway needs and the rest as a dict to re-serialise."""

    body: dict[str, Any]
    model: str
    stream: bool
    client_wants_usage: bool
    """The client asked for the usage chunk (``stream_options.include_usage``)."""
    max_tokens: int | None
    prompt_chars: int

    def estimated_tokens(self, *, default_max_tokens: int, chars_per_token: float) -> int:
        """Tokens to reserve up front: the prompt estimate plus the completion allowance."""
        completion = self.max_tokens if self.max_tokens is not None else default_max_tokens
        return int(self.prompt_chars / chars_per_token) + 1 + completion

    def upstream_body(self, *, priority: int | None) -> bytes:
        """The body sent to the worker: usage forced on for streams, the tier's priority set."""
        body = self.body
        if self.stream:
            options = body.get("stream_options")
            body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        if priority is not None:
            body["priority"] = priority
        return orjson.dumps(body)


def _int_field(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidRequest(f"'{name}' must be a positive integer, got {value!r}.", param=name)
    return value


def _prompt_chars(body: dict[str, Any], prompt_field: str) -> int:
    """Characters of prompt text: message contents (strings or text parts) or the completion prompt."""
    if prompt_field == "prompt":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return len(prompt)
        if isinstance(prompt, list):
            return sum(len(p) if isinstance(p, str | list) else 1 for p in prompt)
        raise InvalidRequest("'prompt' is required: a string or a list.", param="prompt")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' is required: a non-empty list.", param="messages")
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(str(part.get("text", ""))) for part in content if isinstance(part, dict))
    return total


def parse_completion(raw: bytes, *, prompt_field: str) -> CompletionRequest:
    """Parse a chat (``prompt_field="messages"``) or text (``"prompt"``) completion body."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}.") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required: the name of a model.", param="model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest(f"'stream' must be a boolean, got {stream!r}.", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object.", param="stream_options")
    max_tokens = _int_field(body, "max_completion_tokens") or _int_field(body, "max_tokens")
    return CompletionRequest(
        body=body,
        model=model,
        stream=stream,
        client_wants_usage=bool(options and options.get("include_usage")),
        max_tokens=max_tokens,
        prompt_chars=_prompt_chars(body, prompt_field),
    )
