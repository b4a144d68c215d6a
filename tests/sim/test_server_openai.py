"""The simulated worker's OpenAI API through the official ``openai`` client, on a real loopback server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import openai
import pytest

MODEL = "kimi-k3"


@pytest.fixture
def client(sim_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{sim_url}/v1", api_key="unused", max_retries=0, timeout=30) as client:
        yield client


@pytest.fixture
async def aclient(sim_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{sim_url}/v1", api_key="unused", max_retries=0, timeout=30) as client:
        yield client


def test_chat_completion_returns_max_tokens_of_text_and_usage(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me about gears."}], max_tokens=40
    )
    assert resp.object == "chat.completion"
    assert resp.id.startswith("chatcmpl-")
    choice = resp.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 40
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 40


def test_streamed_completion_equals_the_unstreamed_text_for_the_same_request(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=60, seed=11)
    stream = client.completions.create(
        model=MODEL,
        prompt="Once upon a time",
        max_tokens=60,
        seed=11,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length"
    assert all(f is None for f in finishes[:-1])
    assert len(finishes) > 1, "tokens arrive over several engine steps"
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 60
    assert whole.usage is not None
    assert usage_chunk.usage.prompt_tokens == whole.usage.prompt_tokens


def test_generated_text_depends_on_the_seed_and_prompt(client: openai.OpenAI) -> None:
    def text(prompt: str, seed: int) -> str:
        return client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, seed=seed).choices[0].text

    assert text("a", 1) == text("a", 1)
    assert text("a", 1) != text("a", 2)
    assert text("a", 1) != text("b", 1)


async def test_async_streaming_chat_sends_role_content_finish_and_usage(aclient: openai.AsyncOpenAI) -> None:
    stream = await aclient.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=25,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content
    finished = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finished == ["length"]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 25


async def test_async_completion_with_n_gives_distinct_choices(aclient: openai.AsyncOpenAI) -> None:
    resp = await aclient.completions.create(model=MODEL, prompt="x", max_tokens=15, n=3)
    assert sorted(c.index for c in resp.choices) == [0, 1, 2]
    assert len({c.text for c in resp.choices}) == 3
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 45


def test_stop_string_ends_the_choice_before_it(client: openai.OpenAI) -> None:
    free = client.completions.create(model=MODEL, prompt="stop test", max_tokens=40, seed=5).choices[0].text
    words = free.split(" ")
    stop = " " + words[len(words) // 2]
    expected = free[: free.index(stop)]
    stopped = client.completions.create(model=MODEL, prompt="stop test", max_tokens=40, seed=5, stop=[stop])
    assert stopped.choices[0].text == expected
    assert stopped.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=MODEL, prompt="stop test", max_tokens=40, seed=5, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected


def test_exact_prompt_tokens_can_be_given_for_benchmarks(client: openai.OpenAI) -> None:
    resp = client.completions.create(
        model=MODEL, prompt="short", max_tokens=2, extra_body={"gearshift_prompt_tokens": 3000}
    )
    assert resp.usage is not None
    assert resp.usage.prompt_tokens == 3000


def test_completions_default_to_16_tokens_like_vllm(client: openai.OpenAI) -> None:
    resp = client.completions.create(model=MODEL, prompt="p")
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 16


def test_unknown_model_is_a_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    assert "gpt-9" in str(info.value)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 40_000}, "maximum context length"),
        ({"n": 0}, "n"),
        ({"stream_options": {"include_usage": True}}, "stream=True"),
    ],
)
def test_bad_parameters_are_400s_naming_the_problem(
    client: openai.OpenAI, extra: dict[str, object], needle: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="x", extra_body=extra)
    assert needle in str(info.value)


def test_prompt_longer_than_the_context_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "w" * 200_000}])
    assert "maximum context length" in str(info.value)


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b"", b'{"prompt": 5}'])
def test_malformed_bodies_get_vllm_shaped_400s(http: httpx.Client, sim_url: str, body: bytes) -> None:
    resp = http.post(f"{sim_url}/v1/completions", content=body, headers={"Content-Type": "application/json"})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == 400
    assert error["type"] == "BadRequestError"


def test_models_health_version_and_unknown_routes(http: httpx.Client, sim_url: str, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    assert http.get(f"{sim_url}/health").status_code == 200
    assert http.get(f"{sim_url}/version").json()["version"].startswith("0.32")
    missing = http.get(f"{sim_url}/v1/nothing")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == 404
