"""Reading a simulated worker's server-sent events as they arrive, with the client's arrival time of each."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

_TOKEN_TEXT = re.compile(r"[A-Za-z]+|[.,]")
"""One simulated token's text is one word (a leading space or a capital) or one punctuation mark."""


@dataclass(frozen=True, slots=True)
class Event:
    data: dict[str, Any]
    at_s: float
    """Seconds after the request was sent (client clock)."""


def stream_events(http: httpx.Client, url: str, body: dict[str, Any]) -> list[Event]:
    """POST a streaming request and return its JSON events up to ``[DONE]`` (which must come)."""
    start = time.monotonic()
    events: list[Event] = []
    with http.stream("POST", url, json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            if line == "data: [DONE]":
                return events
            events.append(Event(orjson.loads(line[6:]), time.monotonic() - start))
    raise AssertionError("the stream ended without [DONE]")


def chunk_text(data: dict[str, Any]) -> str:
    """The text a chunk of either endpoint carries (chat ``delta.content`` or completion ``text``)."""
    choice = data["choices"][0]
    return str(choice["text"] if "text" in choice else choice["delta"].get("content") or "")


def simulated_tokens(text: str) -> int:
    """How many simulated tokens produced ``text`` (exact for the simulator's word-per-token text)."""
    return len(_TOKEN_TEXT.findall(text))
