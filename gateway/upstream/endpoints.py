"""The API shapes the gateway serves, one ``Endpoint`` each: its worker path, its body parser and its stream meter
(whose ``end`` is the event that ends its stream). The pipeline takes whichever the route names and never branches
on it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.upstream.body import BodyRules, CompletionRequest, parse_completion
from gateway.upstream.responses import ResponsesStreamMeter, parse_responses
from gateway.upstream.sse import StreamMeter


@dataclass(frozen=True, slots=True)
class Endpoint:
    path: str
    """Path on the worker (the same as the gateway's)."""
    operation: str
    """GenAI ``gen_ai.operation.name``."""
    parse: Callable[[bytes, BodyRules], CompletionRequest]
    """The body, parsed and its tokens estimated (400 for one that cannot be)."""
    meter: Callable[[CompletionRequest], StreamMeter]
    """A new meter for one of its streams (its ``end`` closes the stream)."""


def _chat_meter(req: CompletionRequest) -> StreamMeter:
    return StreamMeter(strip_usage=not req.client_wants_usage, strip_chunk_usage=not req.client_wants_chunk_usage)


CHAT = Endpoint(
    "/v1/chat/completions", "chat", lambda raw, rules: parse_completion(raw, prompt_field="messages", rules=rules),
    _chat_meter,
)  # fmt: skip
TEXT = Endpoint(
    "/v1/completions", "text_completion", lambda raw, rules: parse_completion(raw, prompt_field="prompt", rules=rules),
    _chat_meter,
)  # fmt: skip
RESPONSES = Endpoint(
    "/v1/responses", "chat", lambda raw, rules: parse_responses(raw, rules=rules), lambda req: ResponsesStreamMeter()
)
"""OpenAI's Responses API (``gateway.upstream.responses``): its own body and event stream."""
