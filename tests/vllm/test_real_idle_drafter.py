"""The idle-drafter skip on the real CPU vLLM (heavy: three vLLM servers started together, minutes on the shared
2-core machine).

A draft-model worker with the plugin's skip (the default) against the same worker started without speculation:
at k = 0 the greedy outputs are the same, no draft is made and the skip is what ran; when k returns to k_max in
the middle of a batch, the drafter (caught up in one batched pass) is accepted as often as on a batch that
never left k_max. The same check on the ablation without the catch-up (``GEARSHIFT_IDLE_DRAFTER=skip-no-catch-up``)
fails: the tiny model is its own draft model, so its acceptance is 1.0 whenever the drafter's context is right,
and the check would pass whatever the catch-up did unless a wrong context is shown to lower it. Speed is not
asserted here: ``gearshift worker measure --k0-tax`` measures it.

Run: ``scripts/heavy-tests.sh tests/vllm/test_real_idle_drafter.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.procs import free_port
from workers.vllm.cpu_server import (
    TINY_K_MAX,
    ServerSpec,
    ServerStartError,
    running_servers,
    tiny_plan,
    tiny_worker,
)
from workers.vllm.launcher import CpuOptions
from workers.vllm.measure import without_speculation
from workers.vllm.measure_idle import ACCEPTANCE_TOLERANCE, ARM_ENV, NO_CATCH_UP, acceptance_window, idle_tax

from .conftest import CONTROL_TOKEN

pytestmark = [pytest.mark.vllm, pytest.mark.heavy, pytest.mark.timeout(1500)]

BATCH = 8


@pytest.fixture(scope="module")
def servers(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    logs = tmp_path_factory.mktemp("idle")
    draft = {"method": "draft_model", "model": str(tiny_model_dir)}
    specs = {}
    for name in ("skip", "plain", NO_CATCH_UP):
        worker = tiny_worker(port=free_port(), model_dir=tiny_model_dir, worker_id=f"tiny-{name}")
        plan = tiny_plan(worker, cpu=CpuOptions(), speculative_extra=draft)
        env = {"GEARSHIFT_CONTROL_TOKEN": CONTROL_TOKEN, **ARM_ENV[name]}
        plan = without_speculation(plan) if name == "plain" else plan
        specs[name] = ServerSpec(plan, worker.url, logs / f"{name}.log", env)
    try:
        with running_servers(specs, ready_timeout_s=600.0):
            yield {name: spec.url for name, spec in specs.items()} | {"log": str(logs / "skip.log")}
    except ServerStartError as exc:
        pytest.fail(str(exc), pytrace=False)


def test_at_k0_the_skip_runs_no_drafter_and_greedy_outputs_equal_the_server_without_speculation(
    servers: dict[str, str],
) -> None:
    urls = {name: servers[name] for name in ("plain", "skip")}
    run = asyncio.run(
        idle_tax(urls, model="tiny", token=CONTROL_TOKEN, batch_sizes=[1, BATCH], max_tokens=48, rounds=1)
    )
    for n in (1, BATCH):
        assert run.outputs_equal("skip", n)
        assert run.tax("skip", n).drafts == 0
    log = Path(servers["log"]).read_text()
    assert "idle-drafter skip on the V1 runner: DraftModelSkip" in log
    assert "idle-drafter skip: first step without a drafter forward" in log
    assert "idle-drafter skip: a step at k = 0 run without speculative metadata" in log  # the plain sampler's


def test_after_k_returns_the_caught_up_drafter_is_accepted_as_on_a_batch_that_never_left(
    servers: dict[str, str],
) -> None:
    url = servers["skip"]
    common = {"model": "tiny", "token": CONTROL_TOKEN, "k_max": TINY_K_MAX, "requests": BATCH, "max_tokens": 200}
    never = asyncio.run(acceptance_window(url, leave=False, version=1000, **common))  # type: ignore[arg-type]
    back = asyncio.run(acceptance_window(url, leave=True, version=1001, **common))  # type: ignore[arg-type]
    assert never.rate is not None
    assert back.rate is not None
    assert back.counters.drafts > 0
    assert back.rate >= (1 - ACCEPTANCE_TOLERANCE) * never.rate
    assert "idle-drafter catch-up: replayed" in Path(servers["log"]).read_text()
    # the ablation serves the same model and prompts, so its batch that never left k_max is the one above
    ablation = asyncio.run(acceptance_window(servers[NO_CATCH_UP], leave=True, version=1001, **common))  # type: ignore[arg-type]
    assert ablation.counters.drafts > 0
    assert ablation.rate is not None
    assert ablation.rate < (1 - ACCEPTANCE_TOLERANCE) * never.rate  # the check fails without the catch-up
