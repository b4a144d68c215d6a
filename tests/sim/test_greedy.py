"""Replicas agree on greedy and seeded text: it depends on the model, the prompt and the request seed only —
not on the worker's id or seed, its speculation length, its batch, or whether the answer is streamed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from .conftest import sim_settings
from .server_helpers import ThreadedSimServer
from .sse_helpers import chunk_text, stream_events

MODEL = "kimi-k3"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why do gearboxes shift?"}]
EOS_MEAN_TOKENS = 24
"""Both replicas end sequences at a pseudo end-of-sequence (a property of the model, so of every replica)."""


@pytest.fixture(scope="module")
def replicas() -> Iterator[tuple[str, str]]:
    """Two replicas of one model that differ in everything a replica may: id, seed, speculation length."""
    common = {"eos_mean_tokens": EOS_MEAN_TOKENS}
    with (
        ThreadedSimServer(sim_settings(worker_id="sim-a", seed=1, **common)) as a,
        ThreadedSimServer(sim_settings(worker_id="sim-b", seed=99, start_k=1, **common)) as b,
    ):
        yield a.url, b.url


def answers(http: httpx.Client, base_url: str, path: str, body: dict[str, Any]) -> tuple[str, str, int]:
    """(non-streamed text, streamed text, completion tokens) of one request to one replica."""
    whole = http.post(f"{base_url}{path}", json=body)
    assert whole.status_code == 200, whole.text
    data = whole.json()
    choice = data["choices"][0]
    text = choice["text"] if "text" in choice else choice["message"]["content"]
    events = stream_events(http, f"{base_url}{path}", {**body, "stream_options": {"include_usage": True}})
    streamed = "".join(chunk_text(e.data) for e in events if e.data["choices"])
    assert events[-1].data["usage"]["completion_tokens"] == data["usage"]["completion_tokens"]
    return text, streamed, int(data["usage"]["completion_tokens"])


BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": MESSAGES}),
    "completions": ("/v1/completions", {"prompt": "The gear ratio of"}),
}


@pytest.mark.parametrize("endpoint", sorted(BODIES))
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.0, "seed": 5}, {"seed": 42}])
@pytest.mark.parametrize("ignore_eos", [True, False])
def test_greedy_and_seeded_text_is_the_same_on_every_replica_streamed_or_not(
    replicas: tuple[str, str], endpoint: str, sampling: dict[str, Any], ignore_eos: bool
) -> None:
    path, body = BODIES[endpoint]
    request = {"model": MODEL, "max_tokens": 60, "ignore_eos": ignore_eos, **body, **sampling}
    with httpx.Client(timeout=30) as http:
        results = [answers(http, url, path, request) for url in replicas]
    texts = {text for whole, streamed, _ in results for text in (whole, streamed)}
    assert len(texts) == 1, texts
    assert texts.pop()
    tokens = {n for _, _, n in results}
    assert len(tokens) == 1
    if ignore_eos:
        assert tokens == {60}
    else:
        assert tokens.pop() < 60, "the pseudo end-of-sequence ends it early, at the same token on both replicas"


def test_greedy_ignores_the_request_seed_and_seeded_sampling_does_not(replicas: tuple[str, str]) -> None:
    url = replicas[0]
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30) as client:

        def text(**sampling: Any) -> str:
            resp = client.completions.create(model=MODEL, prompt="seeds", max_tokens=30, **sampling)
            return str(resp.choices[0].text)

        greedy = text(temperature=0)
        assert text(temperature=0, seed=1) == text(temperature=0, seed=2) == greedy
        assert text(seed=1) == text(seed=1) != text(seed=2)
        assert text(seed=1) != greedy


def test_greedy_with_several_choices_is_refused_as_vllm_does(replicas: tuple[str, str]) -> None:
    with httpx.Client(timeout=30) as http:
        resp = http.post(
            f"{replicas[0]}/v1/completions", json={"model": MODEL, "prompt": "x", "n": 2, "temperature": 0}
        )
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == "n must be 1 when using greedy sampling, got 2."


@pytest.mark.parametrize("temperature", [-0.5, 2.5, "hot"])
def test_a_temperature_outside_vllms_range_is_a_400(replicas: tuple[str, str], temperature: object) -> None:
    with httpx.Client(timeout=30) as http:
        resp = http.post(
            f"{replicas[0]}/v1/completions", json={"model": MODEL, "prompt": "x", "temperature": temperature}
        )
    assert resp.status_code == 400
    assert "temperature" in resp.json()["error"]["message"]
