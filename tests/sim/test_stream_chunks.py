"""Streaming as vLLM V1 streams: one SSE chunk per engine step carrying that step's new tokens (up to k + 1
under speculation), the chat role delta with the first token, chunk shapes as vLLM 0.32's serving code emits
them (``entrypoints/openai/{chat_completion,completion}/serving.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from .conftest import sim_settings
from .server_helpers import ThreadedSimServer
from .sse_helpers import Event, chunk_text, simulated_tokens, stream_events

MODEL = "kimi-k3"
K = sim_settings().effective_k_max()
"""The worker's speculation length: it starts at the drafter's k_max."""
ENDPOINTS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me about gears."}]}),
    "completions": ("/v1/completions", {"prompt": "Tell me about gears."}),
}
CONTINUOUS = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}


@pytest.fixture(scope="module")
def speculating_url() -> Iterator[str]:
    with ThreadedSimServer(sim_settings(default_workload="code")) as server:
        yield server.url


def body(endpoint: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    path, fields = ENDPOINTS[endpoint]
    return path, {"model": MODEL, "ignore_eos": True, **fields, **extra}


def is_role_chunk(e: Event) -> bool:
    return bool(e.data["choices"]) and "role" in e.data["choices"][0].get("delta", {})


def content_chunks(events: list[Event]) -> list[Event]:
    return [e for e in events if e.data["choices"] and not is_role_chunk(e)]


def step_tokens(chunks: list[Event]) -> list[int]:
    """Tokens each chunk adds, from the cumulative ``continuous_usage_stats`` of its choice."""
    seen: dict[int, int] = {}
    out = []
    for e in chunks:
        index, total = e.data["choices"][0]["index"], e.data["usage"]["completion_tokens"]
        out.append(total - seen.get(index, 0))
        seen[index] = total
    return out


@pytest.mark.parametrize("endpoint", sorted(ENDPOINTS))
def test_each_chunk_carries_one_engine_steps_tokens(speculating_url: str, http: httpx.Client, endpoint: str) -> None:
    path, request = body(endpoint, max_tokens=80, **CONTINUOUS)
    events = stream_events(http, speculating_url + path, request)
    chunks = content_chunks(events)
    per_chunk = step_tokens(chunks)
    assert all(1 <= n <= K + 1 for n in per_chunk), per_chunk
    assert [simulated_tokens(chunk_text(e.data)) for e in chunks] == per_chunk, "a chunk's text is its tokens'"
    assert sum(per_chunk) == events[-1].data["usage"]["completion_tokens"] == 80
    assert len(chunks) < 80, "speculation puts several tokens in one chunk"
    finishes = [e.data["choices"][0]["finish_reason"] for e in chunks]
    assert finishes == [None] * (len(chunks) - 1) + ["length"]
    assert events[-1].data["choices"] == []


def test_without_speculation_each_chunk_is_one_token(start_sim: Callable[..., ThreadedSimServer]) -> None:
    url = start_sim(start_k=0).url
    path, request = body("chat", max_tokens=30, **CONTINUOUS)
    with httpx.Client(timeout=30) as http:
        chunks = content_chunks(stream_events(http, url + path, request))
    assert step_tokens(chunks) == [1] * 30
    assert [simulated_tokens(chunk_text(e.data)) for e in chunks] == [1] * 30


@pytest.mark.parametrize("endpoint", sorted(ENDPOINTS))
def test_a_step_whose_text_is_held_back_for_a_stop_string_still_sends_its_chunk(
    speculating_url: str, http: httpx.Client, endpoint: str
) -> None:
    path, free = body(endpoint, max_tokens=60, seed=3, **CONTINUOUS)
    unstopped = "".join(chunk_text(e.data) for e in content_chunks(stream_events(http, speculating_url + path, free)))
    events = stream_events(http, speculating_url + path, {**free, "stop": ["#" * 40]})
    chunks = content_chunks(events)
    per_chunk = step_tokens(chunks)
    assert all(1 <= n <= K + 1 for n in per_chunk), per_chunk
    assert sum(per_chunk) == 60
    assert "".join(chunk_text(e.data) for e in chunks) == unstopped
    assert chunk_text(chunks[0].data) == "", "the first token's text is held back: it could start the stop string"


def test_the_role_chunk_comes_with_the_first_token_not_before_prefill(
    start_sim: Callable[..., ThreadedSimServer],
) -> None:
    """vLLM sends the role delta when the engine's first output arrives, so time to the first event is TTFT."""
    url = start_sim(speedup=4.0).url
    path, request = body("chat", max_tokens=4, gearshift_prompt_tokens=16_384)
    with httpx.Client(timeout=30) as http:
        events = stream_events(http, url + path, request)
    role, first = events[0], events[1]
    assert is_role_chunk(role)
    assert not is_role_chunk(first)
    assert first.at_s - role.at_s < 0.25 * role.at_s, (role.at_s, first.at_s)


def test_continuous_usage_counts_each_choice_on_its_own(speculating_url: str, http: httpx.Client) -> None:
    path, request = body("completions", max_tokens=20, n=2, prompt=["one prompt", "another prompt here"])
    events = stream_events(http, speculating_url + path, {**request, **CONTINUOUS})
    last: dict[int, dict[str, int]] = {}
    for e in content_chunks(events):
        last[e.data["choices"][0]["index"]] = e.data["usage"]
    assert sorted(last) == [0, 1, 2, 3]
    assert {u["completion_tokens"] for u in last.values()} == {20}
    assert last[0]["prompt_tokens"] == last[1]["prompt_tokens"] < last[2]["prompt_tokens"] == last[3]["prompt_tokens"]
    assert events[-1].data["usage"]["completion_tokens"] == 80


def test_chunks_have_vllms_shapes(speculating_url: str, http: httpx.Client) -> None:
    """Field sets of vLLM 0.32's ``model_dump_json(exclude_unset=True)`` chunks (and ``exclude_none`` usage)."""
    path, request = body("chat", max_tokens=12, stream_options={"include_usage": True})
    events = stream_events(http, speculating_url + path, request)
    assert events[0].data["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert set(events[0].data) == {"id", "object", "created", "model", "choices", "prompt_token_ids", "prompt_text"}
    middle, final = events[1].data["choices"][0], events[-2].data["choices"][0]
    assert set(middle) == {"index", "delta", "logprobs", "finish_reason", "token_ids"}
    assert set(middle["delta"]) == {"content"}
    assert set(final) == {"index", "delta", "logprobs", "finish_reason", "stop_reason", "token_ids"}
    usage = events[-1].data["usage"]  # with --enable-prompt-tokens-details, as the launcher starts vLLM
    assert set(usage) == {"prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details"}
    assert set(usage["prompt_tokens_details"]) == {"cached_tokens"}
    path, request = body("completions", max_tokens=12)
    text_choice = stream_events(http, speculating_url + path, request)[0].data["choices"][0]
    assert set(text_choice) == {
        "index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids",
    }  # fmt: skip
