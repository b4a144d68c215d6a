"""A streaming OpenAI-style client that records what it saw: status, error events, ``[DONE]``, the usage
block, and when tokens arrived (TTFT/TPOT at the client). Used by the soak run and the reliability tests.

Times are ``time.monotonic()`` seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import aiohttp
import orjson


@dataclass(slots=True)
class StreamResult:
    """One request as the client saw it."""

    status: int
    started: float
    ended: float = 0.0
    content_events: int = 0
    """``data:`` events that carried choices (tokens)."""
    role_events: int = 0
    """Events that open an assistant message (``delta.role``): more than one per choice means two responses
    were spliced together."""
    done: bool = False
    """``data: [DONE]`` arrived."""
    error: dict[str, Any] | None = None
    """The OpenAI error object (``{"message", "type", …}``) from an error body or an in-stream error event."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usage_seen: bool = False
    first_token_at: float | None = None
    last_token_at: float | None = None
    transport_error: str | None = None
    """The connection failed (no HTTP status, or the body broke off): the exception's repr."""
    headers: dict[str, str] = field(default_factory=dict)
    reused: bool | None = None
    """The request went out on a pooled connection that had served before (False: a new one; None: the session
    does not trace its connections, ``connection_tracing``)."""

    @property
    def phase(self) -> str | None:
        """Where a transport error struck: ``connect`` (no connection), ``before the response`` (sent, no HTTP
        status: reset, closed by the server, or the client's timeout) or ``mid-body`` (the answer broke off)."""
        if self.transport_error is None:
            return None
        if self.status:
            return "mid-body"
        return "connect" if self.transport_error.startswith("ClientConnectorError") else "before the response"

    @property
    def ok(self) -> bool:
        """A normal answer: 200, ``[DONE]``, no error event, no broken connection."""
        return self.status == 200 and self.done and self.error is None and self.transport_error is None

    @property
    def error_type(self) -> str:
        """A short label: ``ok``, ``http_<status>:<type>``, ``stream:<type>``, ``no_done`` or ``transport``."""
        if self.ok:
            return "ok"
        if self.transport_error is not None:
            return "transport"
        if self.status != 200:
            return f"http_{self.status}:{(self.error or {}).get('type', '?')}"
        if self.error is not None:
            return f"stream:{self.error.get('type', '?')}"
        return "no_done"

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started

    @property
    def tpot_s(self) -> float | None:
        if self.first_token_at is None or self.last_token_at is None or self.completion_tokens < 2:
            return None
        return (self.last_token_at - self.first_token_at) / (self.completion_tokens - 1)


def _feed_event(result: StreamResult, event: bytes, now: float) -> None:
    if not event.startswith(b"data:"):
        return
    payload = event[5:].strip()
    if payload == b"[DONE]":
        result.done = True
        return
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        result.error = {"type": "malformed_event", "message": payload[:200].decode(errors="replace")}
        return
    if not isinstance(obj, dict):
        return
    if isinstance(obj.get("error"), dict):
        result.error = obj["error"]
        return
    usage = obj.get("usage")
    if isinstance(usage, dict):
        result.usage_seen = True
        result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        result.completion_tokens = int(usage.get("completion_tokens") or 0)
    choices = obj.get("choices")
    if choices:
        result.content_events += 1
        first = choices[0] if isinstance(choices, list) and isinstance(choices[0], dict) else {}
        if isinstance(first.get("delta"), dict) and first["delta"].get("role"):
            result.role_events += 1
        if result.first_token_at is None:
            result.first_token_at = now
        result.last_token_at = now


def connection_tracing() -> aiohttp.TraceConfig:
    """A trace config for the session that tells each ``stream_chat`` result whether its connection was pooled
    (``StreamResult.reused``)."""

    async def reused(_: aiohttp.ClientSession, ctx: SimpleNamespace, __: object) -> None:
        if isinstance(ctx.trace_request_ctx, StreamResult):
            ctx.trace_request_ctx.reused = True

    async def created(_: aiohttp.ClientSession, ctx: SimpleNamespace, __: object) -> None:
        if isinstance(ctx.trace_request_ctx, StreamResult):
            ctx.trace_request_ctx.reused = False

    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(reused)
    trace.on_connection_create_end.append(created)
    return trace


async def stream_chat(
    session: aiohttp.ClientSession,
    url: str,
    *,
    key: str,
    body: dict[str, Any],
    timeout_s: float = 120.0,
    headers: dict[str, str] | None = None,
    progress: Callable[[StreamResult], None] | None = None,
) -> StreamResult:
    """POST a streaming chat completion to ``url`` (the gateway's base URL) and read it to the end;
    ``progress`` is called after every chunk."""
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    result = StreamResult(status=0, started=time.monotonic())
    hdrs = {"authorization": f"Bearer {key}", "content-type": "application/json", **(headers or {})}
    try:
        async with asyncio.timeout(timeout_s):
            post = session.post(url + "/v1/chat/completions", data=orjson.dumps(payload), headers=hdrs,
                                trace_request_ctx=result)  # fmt: skip
            async with post as resp:
                result.status = resp.status
                result.headers = {k.lower(): v for k, v in resp.headers.items()}
                if resp.status != 200:
                    data = await resp.read()
                    try:
                        parsed = orjson.loads(data)
                        result.error = parsed.get("error") if isinstance(parsed, dict) else None
                    except orjson.JSONDecodeError:
                        result.error = {"type": "not_json", "message": data[:200].decode(errors="replace")}
                    return result
                pending = b""
                async for chunk in resp.content.iter_any():
                    now = time.monotonic()
                    pending += chunk
                    *events, pending = pending.split(b"\n\n")
                    for event in events:
                        _feed_event(result, event.strip(), now)
                    if progress is not None:
                        progress(result)
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        result.transport_error = repr(exc)
    finally:
        result.ended = time.monotonic()
    return result
