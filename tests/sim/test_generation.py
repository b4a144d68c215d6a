"""The real-time driver and a request's generation, on a manual clock (no sleeping)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from fleet.clock import ManualClock
from workers.sim.driver import Delivery, RealTimeDriver
from workers.sim.engine import EngineCore, StepOutcome
from workers.sim.generation import ChoiceDelta, EngineFailed, Generation, GenerationSpec, PromptSpec
from workers.sim.text import (
    TextStream,
    choice_seed,
    count_chat_tokens,
    count_text_tokens,
    pseudo_eos_length,
    text_seed,
)

from .engine_helpers import make_engine, req
from .sse_helpers import simulated_tokens


@pytest.fixture
async def driver() -> AsyncIterator[RealTimeDriver]:
    clock = ManualClock()
    d = RealTimeDriver(make_engine(clock=clock), clock=clock, speedup=4.0)
    await d.start()
    yield d
    await d.stop()


def spec(
    *,
    stops: list[str] | None = None,
    n: int = 1,
    max_tokens: int = 40,
    eos: int | None = None,
    temperature: float | None = None,
    worker_seed: int = 0,
) -> GenerationSpec:
    return GenerationSpec(
        model="kimi-k3",
        prompts=[PromptSpec("prompt", 10)],
        n=n,
        max_tokens=[max_tokens],
        stops=stops or [],
        workload="chat",
        priority=0,
        temperature=temperature,
        request_seed=1,
        ignore_eos=False,
        eos_mean_tokens=eos,
        worker_seed=worker_seed,
    )


async def run(driver: RealTimeDriver, s: GenerationSpec) -> list[ChoiceDelta]:
    g = Generation(driver, s)
    g.submit()
    return [d async for d in g.deltas()]


async def test_driver_delivers_every_token_and_runs_simulated_time_at_speedup(driver: RealTimeDriver) -> None:
    sink: asyncio.Queue[Delivery] = asyncio.Queue()
    driver.submit(req("r", max_tokens=25), sink, choice=3)
    deliveries: list[Delivery] = []
    while not (deliveries and deliveries[-1].finished):
        deliveries.append(await asyncio.wait_for(sink.get(), timeout=5))
    assert sum(d.tokens for d in deliveries) == 25
    assert {d.choice for d in deliveries} == {3}
    assert driver.engine.now_s == pytest.approx(driver.sim_now(), abs=1e-5)  # ManualClock counts from 1.7e9 s
    assert driver.engine.stats.busy_s == pytest.approx(driver.engine.now_s, abs=1e-5)


async def test_text_is_deterministic_and_finishes_with_length(driver: RealTimeDriver) -> None:
    first, second = await run(driver, spec()), await run(driver, spec())
    assert "".join(d.text for d in first) == "".join(d.text for d in second)
    assert [d.finish_reason for d in first][-1] == "length"
    assert all(d.finish_reason is None for d in first[:-1])


async def test_each_delta_is_one_engine_steps_tokens(driver: RealTimeDriver) -> None:
    g = Generation(driver, spec(max_tokens=60))
    g.submit()
    deltas = [d async for d in g.deltas()]
    assert all(1 <= d.tokens <= 4 + 1 for d in deltas), [d.tokens for d in deltas]  # the driver's engine runs k=4
    assert [simulated_tokens(d.text) for d in deltas] == [d.tokens for d in deltas]
    assert sum(d.tokens for d in deltas) == g.completion_tokens == 60
    assert len(deltas) < 60
    assert g.choice_usage(0) == (10, 60)


def test_greedy_and_seeded_text_is_pinned_to_the_model_prompt_and_request_seed() -> None:
    def seed(
        *,
        model: str = "m",
        prompt: str = "p",
        choice: int = 0,
        temperature: float | None = None,
        request_seed: int | None = None,
        worker_seed: int = 0,
    ) -> int:
        return choice_seed(
            model=model,
            prompt=prompt,
            choice=choice,
            temperature=temperature,
            request_seed=request_seed,
            worker_seed=worker_seed,
        )

    greedy = seed(temperature=0.0)
    assert greedy == seed(temperature=0.0, worker_seed=9, request_seed=3) == seed(temperature=1e-6)
    assert greedy != seed(temperature=0.0, model="other") != seed(temperature=0.0, prompt="q")
    assert seed(request_seed=3, worker_seed=1) == seed(request_seed=3, worker_seed=2) == seed(request_seed=2, choice=1)
    assert seed(worker_seed=1) != seed(worker_seed=2), "unseeded sampled text may differ between replicas"
    assert seed(temperature=0.5, request_seed=3) == seed(request_seed=3)


async def test_greedy_text_ignores_the_worker_seed(driver: RealTimeDriver) -> None:
    def text(deltas: list[ChoiceDelta]) -> str:
        return "".join(d.text for d in deltas)

    greedy = [text(await run(driver, spec(temperature=0.0, worker_seed=w, eos=15))) for w in (1, 2)]
    assert greedy[0] == greedy[1]
    seeded = [text(await run(driver, spec(worker_seed=w))) for w in (1, 2)]
    assert seeded[0] == seeded[1], "the spec's request seed pins sampled text too"


async def test_a_stop_string_spanning_tokens_is_held_back_and_cut(driver: RealTimeDriver) -> None:
    full = "".join(d.text for d in await run(driver, spec()))
    words = full.split(" ")
    stop = words[5][-2:] + " " + words[6][:2]  # straddles two tokens
    expected = full[: full.index(stop)]
    deltas = await run(driver, spec(stops=["never-there", stop]))
    assert "".join(d.text for d in deltas) == expected
    assert (deltas[-1].finish_reason, deltas[-1].stop_reason) == ("stop", stop)
    assert not driver.engine.has_work(), "the engine request is aborted at the stop string"


async def test_a_stop_string_keeps_only_the_tokens_through_it_like_vllm(driver: RealTimeDriver) -> None:
    """vLLM drops the tokens a multi-token step generated after the one completing a stop string."""
    full = "".join(d.text for d in await run(driver, spec(max_tokens=60)))
    words = full.split(" ")
    for word in words[3:20]:
        stop = word[:2]
        end = full.index(stop) + len(stop)
        g = Generation(driver, spec(stops=[stop], max_tokens=60))
        g.submit()
        deltas = [d async for d in g.deltas()]
        assert g.completion_tokens == sum(d.tokens for d in deltas) == simulated_tokens(full[:end]), stop


async def test_n_choices_differ_and_each_finishes(driver: RealTimeDriver) -> None:
    deltas = await run(driver, spec(n=3, max_tokens=12))
    texts = {i: "".join(d.text for d in deltas if d.index == i) for i in range(3)}
    assert len(set(texts.values())) == 3
    assert sorted(d.index for d in deltas if d.finish_reason) == [0, 1, 2]


async def test_pseudo_eos_ends_a_request_early_with_stop(driver: RealTimeDriver) -> None:
    g = Generation(driver, spec(max_tokens=10_000, eos=20))
    g.submit()
    deltas = [d async for d in g.deltas()]
    assert deltas[-1].finish_reason == "stop"
    assert deltas[-1].stop_reason is None
    assert g.completion_tokens < 10_000


async def test_leaving_the_delta_stream_early_aborts_the_engine_requests(driver: RealTimeDriver) -> None:
    g = Generation(driver, spec(n=2, max_tokens=5_000))
    g.submit()
    stream = g.deltas()
    await anext(stream)
    await stream.aclose()
    assert not driver.engine.has_work()


def test_token_counting_and_pseudo_eos_are_documented_approximations() -> None:
    assert count_text_tokens("") == 1
    assert count_text_tokens("a" * 400) == 100
    assert count_chat_tokens(["a" * 40, "b" * 4]) == 10 + 1 + 2 * 4 + 3
    lengths = [pseudo_eos_length(text_seed(i), 50) for i in range(2000)]
    assert min(lengths) >= 1
    assert 45 < sum(lengths) / len(lengths) < 55
    assert TextStream(7).take(30) == TextStream(7).take(30)


class FailsOnce:
    """An engine whose next step raises once (a simulator bug), then works again. It wraps the engine rather than
    subclassing it: the engine may be compiled (``workers.sim.native``), and Python classes cannot subclass that."""

    def __init__(self, engine: EngineCore) -> None:
        object.__setattr__(self, "inner", engine)
        object.__setattr__(self, "fail_next", True)

    def step(self) -> StepOutcome:
        if self.fail_next:
            object.__setattr__(self, "fail_next", False)
            raise RuntimeError("injected engine failure")
        return cast(EngineCore, self.inner).step()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.inner, name, value)


async def test_an_engine_failure_fails_its_requests_and_the_loop_survives(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    base = make_engine(clock=clock)
    engine = FailsOnce(EngineCore(base.profile, base.control, seed=1))
    driver = RealTimeDriver(cast(EngineCore, engine), clock=clock)
    await driver.start()
    try:
        with pytest.raises(EngineFailed):
            await run(driver, spec())
        assert "injected engine failure" in caplog.text
        assert driver.step_errors == 1
        assert not engine.has_work()
        deltas = await run(driver, spec(max_tokens=5))
        assert deltas[-1].finish_reason == "length"
    finally:
        await driver.stop()
