"""Server-sent events from a worker: split into events, find the usage block, strip it when the client did
not ask for it, hold back ``[DONE]`` (the relay sends it after metering), and note when tokens arrive (for TTFT
and TPOT at the gateway).

Events are forwarded as soon as they are complete (``\\n\\n``-terminated); only a partial event is held back.
Only events that mention ``"usage"`` are parsed — every other event passes through as bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

DONE = b"data: [DONE]"


@dataclass(slots=True)
class Usage:
    """Token counts from a worker's usage block."""

    prompt_tokens: int = 0
    completion_tokens: int = 0


def usage_of(obj: object) -> Usage | None:
    """The usage block of a response or chunk object, if it carries one."""
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    return Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))


@dataclass(slots=True)
class StreamMeter:
    """Reads a worker's event stream as it passes; times are the caller's monotonic seconds."""

    strip_usage: bool
    usage: Usage | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    token_events: int = 0
    done: bool = False
    _pending: bytes = b""

    def feed(self, chunk: bytes, now: float) -> bytes:
        """Add a chunk from the worker; return the complete events to forward to the client."""
        data = self._pending + chunk if self._pending else chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self._pending = data
            return b""
        self._pending = data[end + 2 :]
        complete = data[: end + 2]
        if b'"usage"' not in complete and DONE not in complete:
            self._count_tokens(complete.count(b"data:"), now)
            return complete
        out = []
        for event in complete.split(b"\n\n")[:-1]:
            if self._keep(event, now):
                out.append(event + b"\n\n")
        return b"".join(out)

    def flush(self) -> bytes:
        """What is left of a partial event at the end of the stream."""
        rest, self._pending = self._pending, b""
        return rest

    def _count_tokens(self, events: int, now: float) -> None:
        if events:
            self.token_events += events
            if self.first_token_at is None:
                self.first_token_at = now
            self.last_token_at = now

    def _keep(self, event: bytes, now: float) -> bool:
        if event.startswith(DONE):
            self.done = True  # the relay sends [DONE] itself, after metering
            return False
        if b'"usage"' not in event or not event.startswith(b"data:"):
            self._count_tokens(event.count(b"data:"), now)
            return True
        try:
            obj = orjson.loads(event[5:])
        except orjson.JSONDecodeError:
            return True
        usage = usage_of(obj)
        if usage is None:
            self._count_tokens(1, now)
            return True
        self.usage = usage
        usage_only = isinstance(obj, dict) and not obj.get("choices")
        if not usage_only:
            self._count_tokens(1, now)
        return not (usage_only and self.strip_usage)
