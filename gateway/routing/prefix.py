"""Prefix affinity: send a request to a worker that recently served the same prompt beginning, so the worker's
prefix cache (vLLM's ``--enable-prefix-caching``) skips that part of the prefill — without letting one hot prefix
pin one worker.

**Blocks.** The gateway has no tokenizer, so it hashes characters: the prompt as the worker's chat template would
lay it out — the ``tools`` schemas first (templates render them into the system prompt), then each message's role,
text and tool calls in order (a Responses API body's ``instructions`` and ``input`` items read as those messages;
or the completion prompt) — cut into blocks of ``block_chars`` characters, of which
only full blocks count, at most ``max_blocks``. Block ``i``'s hash chains the blocks before it
(``h_i = hash((h_{i-1}, block_i))``), so equal hashes mean equal beginnings. A multi-turn conversation's next
request repeats the previous messages, so it shares the previous request's blocks. Python's string hash is
randomised per process, which is harmless: the index lives in one gateway process.

**Index.** ``PrefixIndex`` remembers, per block hash and worker, when that worker was last sent a request holding
the block (Unix seconds). It is approximate, as the worker's cache is not observed: an entry counts for ``ttl_s``
after its last use, and at most ``capacity`` entries are kept (the least recently used are dropped; about 200 bytes
each).

**Score.** ``gateway.routing.scorers.prefix.PrefixScorer`` gives each worker ``matched / blocks``: the share of
the request's leading blocks recorded for it. Bounded load: a worker whose load exceeds ``load_factor × (least +
1)`` — least being the smallest load among the candidates, load as the queue scorer counts it
(``gateway.routing.pool.occupancy``) — scores 0, so affinity gives way once its worker is busier than the others by that
factor, and a hot prefix spreads over the workers (each then holds it too).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import orjson


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "".join(str(p.get("text", "")) if isinstance(p, dict) else "" for p in content)
    else:
        text = ""
    extra = message.get("tool_calls")
    calls = orjson.dumps(extra).decode() if extra else ""
    return f"\x1e{message.get('role', '')}\x1f{text}{calls}"


def _responses_messages(body: Mapping[str, Any]) -> list[Any] | None:
    """A Responses API body's ``instructions`` and ``input`` as the chat messages a worker renders them as: the
    instructions as a system message, a string as a user message, a function call as an assistant tool call, a
    function output as a tool message, a message item as it is. None when the body has no ``input``."""
    items = body.get("input")
    items = [items] if isinstance(items, str) else items
    if not isinstance(items, list):
        return None
    instructions = body.get("instructions")
    messages: list[Any] = [{"role": "system", "content": instructions}] if instructions else []
    for item in items:
        kind = item.get("type") if isinstance(item, dict) else None
        if isinstance(item, str):
            messages.append({"role": "user", "content": item})
        elif kind == "function_call":
            function = {"name": item.get("name"), "arguments": item.get("arguments")}
            messages.append({"role": "assistant", "tool_calls": [{"id": item.get("call_id"), "function": function}]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": item.get("output")})
        else:
            messages.append(item)
    return messages


def prompt_text(body: Mapping[str, Any], *, chat: bool, limit: int | None = None) -> str:
    """The prompt laid out in the order the worker sees it (see the module docstring); "" when there is none. With
    ``limit``, messages past the first ``limit`` characters are left out (they cannot reach a hashed block)."""
    if not chat:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            return orjson.dumps(prompt).decode()
        return ""  # a batch of prompts: no single prefix to follow
    messages = body.get("messages")
    if not isinstance(messages, list):
        messages = _responses_messages(body)
    if messages is None:
        return ""
    tools = body.get("tools")
    parts = [orjson.dumps(tools).decode()] if tools else []
    size = len(parts[0]) if parts else 0
    for m in messages:
        if limit is not None and size >= limit:
            break
        if isinstance(m, dict):
            parts.append(_message_text(m))
            size += len(parts[-1])
    return "".join(parts)


def block_hashes(text: str, *, block_chars: int, max_blocks: int) -> tuple[int, ...]:
    """Chained hashes of the full ``block_chars``-character blocks of ``text``, at most ``max_blocks``."""
    count = min(len(text) // block_chars, max_blocks)
    out = []
    prev = 0
    for i in range(count):
        prev = hash((prev, text[i * block_chars : (i + 1) * block_chars]))
        out.append(prev)
    return tuple(out)


def request_blocks(body: Mapping[str, Any], *, chat: bool, block_chars: int, max_blocks: int) -> tuple[int, ...]:
    """The block hashes of a completion body's prompt (``prompt_text`` then ``block_hashes``)."""
    text = prompt_text(body, chat=chat, limit=block_chars * max_blocks)
    return block_hashes(text, block_chars=block_chars, max_blocks=max_blocks)


class PrefixIndex:
    """(block hash, worker id) → Unix seconds that worker was last sent a request holding that block, least
    recently used first, at most ``capacity`` entries; entries older than ``ttl_s`` seconds do not count."""

    def __init__(self, *, ttl_s: float, capacity: int) -> None:
        if ttl_s <= 0 or capacity <= 0:
            raise ValueError("ttl_s and capacity: must be positive")
        self.ttl_s = ttl_s
        self.capacity = capacity
        self._seen: OrderedDict[tuple[int, str], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def record(self, blocks: Sequence[int], worker_id: str, now: float) -> None:
        """``worker_id`` was sent a request whose prompt holds ``blocks`` (at Unix time ``now``)."""
        seen = self._seen
        for h in reversed(blocks):  # the beginning most recent: evicted last, as the worker's cache keeps it longest
            key = (h, worker_id)
            if key in seen:
                seen.move_to_end(key)
            seen[key] = now
        while len(seen) > self.capacity:
            seen.popitem(last=False)

    def matches(self, blocks: Sequence[int], worker_ids: Sequence[str], now: float) -> dict[str, int]:
        """Worker id → how many leading ``blocks`` were recorded for it within the TTL (0 for none). Entries are
        recorded a whole prefix at a time (its beginning last, so evicted last) and the hashes are chained, so a
        worker's recorded blocks are a leading run: a binary search finds its end in about log2(blocks) lookups."""
        oldest = now - self.ttl_s
        seen = self._seen
        matched = {}
        for w in worker_ids:
            lo, hi = 0, len(blocks)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if seen.get((blocks[mid - 1], w), -math.inf) >= oldest:
                    lo = mid
                else:
                    hi = mid - 1
            matched[w] = lo
        return matched
