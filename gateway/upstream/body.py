"""Reading and rewriting a completion request body.

The body is parsed once with orjson; only ``model``, ``stream``, ``stream_options``, ``max_tokens`` /
``max_completion_tokens``, ``n`` / ``best_of``, the prompt (for the token estimate) and ``priority`` are
read or changed. Every other field passes to the worker untouched. No pydantic model of the whole body is built
on the hot path. The request's token estimates are made once, when it is parsed (``BodyRules``).

The prompt estimate counts what the worker's chat template renders: message texts, the ``tools`` schemas and
earlier tool calls (an assistant message's ``tool_calls`` and the ``tool`` messages' results) as their JSON
characters, and each image part (``image_url``, ``input_image``, ``image``) as ``tokens_per_image``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.settings import GatewaySettings


@dataclass(frozen=True, slots=True)
class BodyRules:
    """The limits on a completion body and how its tokens are estimated (the gateway settings of the same names
    hold their meaning and defaults)."""

    max_messages: int
    """Most messages (or completion prompts)."""
    max_n: int
    """Most choices (``n``, ``best_of``)."""
    default_max_tokens: int
    """Completion tokens reserved per choice when the request sets no ``max_tokens``."""
    chars_per_token: float
    tokens_per_message: int
    """Chat-template tokens per message (and as many again to prime the reply)."""
    tokens_per_image: int
    """Prompt tokens counted per image part."""

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> BodyRules:
        s = settings
        return cls(
            max_messages=s.max_messages, max_n=s.max_n, default_max_tokens=s.default_max_tokens,
            chars_per_token=s.chars_per_token, tokens_per_message=s.tokens_per_message,
            tokens_per_image=s.tokens_per_image,
        )  # fmt: skip


def sequences(*, chat: bool, prompts: int, choices: int) -> int:
    """Sequences a request generates, each allowed ``max_tokens``: every choice (``n``) of every prompt (a chat
    has one prompt; a text completion may list several)."""
    return choices * (1 if chat else prompts)


@dataclass(slots=True)
class CompletionRequest:
    """A parsed request: the fields the gateway needs and the rest as a dict to re-serialise."""

    body: dict[str, Any]
    model: str
    stream: bool
    client_wants_usage: bool
    """The client asked for the usage chunk (``stream_options.include_usage``)."""
    client_wants_chunk_usage: bool
    """The client asked for usage in every chunk too (``continuous_usage_stats`` with ``include_usage``, as vLLM
    reads them)."""
    max_tokens: int | None
    prompt_parts: tuple[int, ...]
    """Characters of each prompt text (one per chat message with its tool calls, or per completion prompt)."""
    chat: bool
    choices: int = 1
    """Sequences generated per prompt: the larger of ``n`` and ``best_of``."""
    prompt_tokens: int = 0
    """Estimated prompt tokens (the work the worker must prefill)."""
    reserved_tokens: int = 0
    """Tokens to reserve up front: ``prompt_tokens`` plus the completion allowance."""
    max_tokens_field: str = "max_tokens"
    """The body field that caps the completion (``max_output_tokens`` in the Responses API)."""
    usage_options: bool = True
    """Streams ask the worker for usage with ``stream_options`` (the Responses API has none: its last event
    carries the usage)."""

    def cap_max_tokens(self, cap: int, *, default_max_tokens: int) -> bool:
        """Lower ``max_tokens`` (body and reservation) to ``cap``; False when the request already asks for no more.
        The reservation shrinks by the completion tokens taken off every sequence, as ``estimate`` reserved them."""
        asked = self.max_tokens if self.max_tokens is not None else default_max_tokens
        if asked <= cap:
            return False
        self.reserved_tokens -= (asked - cap) * sequences(chat=self.chat, prompts=len(self.prompt_parts),
                                                          choices=self.choices)  # fmt: skip
        self.max_tokens = cap
        self.body.pop("max_completion_tokens", None)
        self.body[self.max_tokens_field] = cap
        return True

    def upstream_body(self, *, priority: int | None) -> bytes:
        """The body sent to the worker: for streams, usage forced on — the usage chunk, and each chunk's running
        count (vLLM's ``continuous_usage_stats``) so a stream cut short is metered in tokens; the tier's priority
        set."""
        body = self.body
        if self.stream and self.usage_options:
            options = body.get("stream_options")
            body["stream_options"] = {
                **(options if isinstance(options, dict) else {}),
                "include_usage": True,
                "continuous_usage_stats": True,
            }
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


def _prompt_parts(body: dict[str, Any], prompt_field: str, *, max_messages: int) -> tuple[int, ...]:
    """Characters of each prompt text: message contents (strings or text parts) or the completion prompt(s).
    A prompt of token ids counts 4 characters per id, so it estimates one token per id."""
    if prompt_field == "prompt":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return (len(prompt),)
        if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
            return (4 * len(prompt),)  # one prompt as token ids
        if isinstance(prompt, list) and prompt:
            if len(prompt) > max_messages:
                message = f"'prompt' has {len(prompt)} prompts; the limit is {max_messages}."
                raise InvalidRequest(message, param="prompt")
            return tuple(len(p) if isinstance(p, str) else 4 * len(p) if isinstance(p, list) else 4 for p in prompt)
        raise InvalidRequest("'prompt' is required: a string or a non-empty list.", param="prompt")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' is required: a non-empty list.", param="messages")
    if len(messages) > max_messages:
        raise InvalidRequest(f"'messages' has {len(messages)} entries; the limit is {max_messages}.", param="messages")
    return tuple(_message_chars(m) for m in messages)


IMAGE_PART_TYPES = frozenset({"image_url", "input_image", "image"})


def _message_chars(message: object) -> int:
    """Characters of a chat message: its text (a string or text parts) and its tool calls' JSON."""
    if not isinstance(message, dict):
        return 0
    content, calls = message.get("content"), message.get("tool_calls")
    chars = len(orjson.dumps(calls)) if calls else 0
    if isinstance(content, str):
        return chars + len(content)
    if isinstance(content, list):
        chars += sum(len(str(part.get("text", ""))) for part in content if isinstance(part, dict))
    return chars


def count_images(items: object) -> int:
    """Image parts in a list of messages (or Responses API input items)."""
    if not isinstance(items, list):
        return 0
    count = 0
    for item in items:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, list):
            count += sum(1 for part in content if isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES)
    return count


def schema_chars(body: dict[str, Any]) -> int:
    """Characters of the request's ``tools`` schemas as JSON (the chat template renders them into the prompt)."""
    tools = body.get("tools")
    return len(orjson.dumps(tools)) if isinstance(tools, list) and tools else 0


def estimate(
    parts: tuple[int, ...],
    *,
    chat: bool,
    max_tokens: int | None,
    choices: int,
    rules: BodyRules,
    images: int = 0,
    schema: int = 0,
) -> tuple[int, int]:
    """The estimated prompt tokens and the tokens to reserve (prompt plus completion allowance). The prompt
    estimate is ``ceil(chars / chars_per_token)`` per text, plus, for a chat, ``tokens_per_message`` per message
    and as many again to prime the reply (chat templates add about that much), ``ceil(schema /
    chars_per_token)`` for ``schema`` characters of tool schemas and ``tokens_per_image`` per image. The
    completion allowance is ``max_tokens`` for every choice (``n``) of every prompt."""
    prompt = sum(max(1, math.ceil(n / rules.chars_per_token)) for n in parts)
    if chat:
        prompt += rules.tokens_per_message * (len(parts) + 1)
    prompt += math.ceil(schema / rules.chars_per_token) + images * rules.tokens_per_image
    allowance = max_tokens if max_tokens is not None else rules.default_max_tokens
    completion = allowance * sequences(chat=chat, prompts=len(parts), choices=choices)
    return prompt, prompt + completion


def body_head(raw: bytes) -> tuple[dict[str, Any], str]:
    """A request body as a JSON object and its ``model`` (400 naming what is wrong otherwise)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}.") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required: the name of a model.", param="model")
    return body, model


def parse_completion(raw: bytes, *, prompt_field: str, rules: BodyRules) -> CompletionRequest:
    """Parse a chat (``prompt_field="messages"``) or text (``"prompt"``) completion body and estimate its tokens."""
    body, model = body_head(raw)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest(f"'stream' must be a boolean, got {stream!r}.", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object.", param="stream_options")
    max_tokens = _int_field(body, "max_completion_tokens") or _int_field(body, "max_tokens")
    choices = max(_int_field(body, "n") or 1, _int_field(body, "best_of") or 1)
    if choices > rules.max_n:
        raise InvalidRequest(f"'n' (or 'best_of') is {choices}; the limit is {rules.max_n}.", param="n")
    parts = _prompt_parts(body, prompt_field, max_messages=rules.max_messages)
    chat = prompt_field == "messages"
    prompt_tokens, reserved = estimate(
        parts, chat=chat, max_tokens=max_tokens, choices=choices, rules=rules,
        images=count_images(body.get("messages")) if chat else 0, schema=schema_chars(body) if chat else 0,
    )  # fmt: skip
    return CompletionRequest(
        body=body,
        model=model,
        stream=stream,
        client_wants_usage=bool(options and options.get("include_usage")),
        client_wants_chunk_usage=bool(
            options and options.get("include_usage") and options.get("continuous_usage_stats")
        ),
        max_tokens=max_tokens,
        prompt_parts=parts,
        chat=chat,
        choices=choices,
        prompt_tokens=prompt_tokens,
        reserved_tokens=reserved,
    )
