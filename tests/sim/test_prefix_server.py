"""The simulated worker's prefix cache over HTTP: a multi-turn chat's next turn is served from the cache, its usage
says so (``prompt_tokens_details.cached_tokens``) and ``/metrics`` counts it under vLLM's names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import orjson

from .server_helpers import ThreadedSimServer, metric_value

SYSTEM = "You are a careful coding agent. Read the code before you change it. " * 30


def _chat(http: httpx.Client, url: str, messages: list[dict[str, str]], *, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": messages, "max_tokens": 8, "temperature": 0}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        with http.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            lines = [line for line in response.iter_lines() if line.startswith("data: {")]
        usage = orjson.loads(lines[-1][6:])["usage"]
        return {"usage": usage}
    response = http.post(f"{url}/v1/chat/completions", json=body)
    response.raise_for_status()
    payload: dict[str, Any] = response.json()
    return payload


def test_a_next_turn_reads_its_prefix_from_the_cache(
    start_sim: Callable[..., ThreadedSimServer], http: httpx.Client
) -> None:
    sim = start_sim()
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Why does test_parse fail?"}]
    first = _chat(http, sim.url, turn1, stream=False)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    answer = first["choices"][0]["message"]["content"]
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "Fix it."}]
    second = _chat(http, sim.url, turn2, stream=True)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    turn1_tokens = first["usage"]["prompt_tokens"]
    # every full 16-token block of the first turn's messages (its 3 reply-priming tokens differ)
    assert cached == (turn1_tokens - 3) // 16 * 16
    assert metric_value(http, sim.url, "vllm:prefix_cache_hits_total") == cached
    queries = metric_value(http, sim.url, "vllm:prefix_cache_queries_total")
    assert queries == turn1_tokens + second["usage"]["prompt_tokens"]
    assert metric_value(http, sim.url, "vllm:prompt_tokens_cached_total") == cached


def test_prefix_caching_and_the_details_can_be_turned_off(
    start_sim: Callable[..., ThreadedSimServer], http: httpx.Client
) -> None:
    sim = start_sim(enable_prefix_caching=False, enable_prompt_tokens_details=False)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello."}]
    for _ in range(2):
        assert _chat(http, sim.url, messages, stream=False)["usage"]["prompt_tokens_details"] is None
    assert "prompt_tokens_details" not in _chat(http, sim.url, messages, stream=True)["usage"]
    assert metric_value(http, sim.url, "vllm:prefix_cache_hits_total") == 0
    assert metric_value(http, sim.url, "vllm:prefix_cache_queries_total") == 0
