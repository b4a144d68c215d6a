"""``internals.call_engine`` against a fake engine client shaped like vLLM's ``AsyncLLM``."""

from __future__ import annotations

from typing import Any

import pytest

from workers.vllm.control import EngineSideMissing
from workers.vllm.internals import ENGINE_METHOD, call_engine, install_engine_hooks


class FakeCoreClient:
    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.error = error

    async def call_utility_async(self, method: str, *args: Any) -> Any:
        self.calls.append((method, args))
        if self.error is not None:
            raise self.error
        return {"status": 200, "echo": args[0]}


class FakeEngineClient:
    def __init__(self, core: FakeCoreClient) -> None:
        self.engine_core = core


async def test_call_engine_sends_one_utility_call() -> None:
    core = FakeCoreClient()
    reply = await call_engine(FakeEngineClient(core), {"op": "get"})
    assert reply == {"status": 200, "echo": {"op": "get"}}
    assert core.calls == [(ENGINE_METHOD, ({"op": "get"},))]


async def test_a_missing_engine_method_is_named() -> None:
    core = FakeCoreClient(
        RuntimeError(f"Call to {ENGINE_METHOD} method failed: 'EngineCoreProc' object has no attribute")
    )
    with pytest.raises(EngineSideMissing):
        await call_engine(FakeEngineClient(core), {"op": "get"})


async def test_other_failures_propagate() -> None:
    core = FakeCoreClient(ConnectionError("gone"))
    with pytest.raises(ConnectionError):
        await call_engine(FakeEngineClient(core), {"op": "get"})


class FakeEngineCore:
    """Shaped like vLLM's EngineCore where the hooks touch it: two step functions."""

    def __init__(self) -> None:
        self.steps: list[str] = []

    def step(self) -> str:
        self.steps.append("step")
        return "stepped"

    def step_with_batch_queue(self) -> str:
        self.steps.append("batch")
        return "batched"


def test_hooks_run_before_each_step_and_expose_the_method() -> None:
    seen: list[tuple[str, Any]] = []

    def before_step(core: Any) -> None:
        seen.append(("before", core))
        if len(seen) == 2:
            raise RuntimeError("control bug")  # must not reach the engine loop

    def handle(core: Any, request: dict[str, Any]) -> dict[str, Any]:
        return {"status": 200, "core": core, "request": request}

    cls = type("Core", (FakeEngineCore,), {})
    assert install_engine_hooks(handle=handle, before_step=before_step, engine_core_class=cls)
    assert install_engine_hooks(handle=handle, before_step=before_step, engine_core_class=cls)  # idempotent
    core = cls()
    assert core.step() == "stepped"
    assert core.step_with_batch_queue() == "batched"
    assert core.steps == ["step", "batch"]
    assert seen == [("before", core), ("before", core)]
    assert getattr(core, ENGINE_METHOD)({"op": "get"}) == {"status": 200, "core": core, "request": {"op": "get"}}


def test_without_vllm_the_hooks_stay_out() -> None:
    assert install_engine_hooks(handle=lambda core, req: {}, before_step=lambda core: None) is False
