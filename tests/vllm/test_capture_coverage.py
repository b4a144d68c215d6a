"""What vLLM 0.32's Model Runner V2 captures for the launcher's exact command lines, by vLLM's own code.

No GPU here: ``capture_probe.py`` runs in ``.venv-vllm`` and builds, from the launcher's argv, the ``VllmConfig``,
vLLM's capture sizes and ``CudaGraphManager`` descriptors, then asks ``CudaGraphManager.dispatch`` about a
uniform decode of every (k, batch size), as the GPU runner does before each step. The rule is not re-implemented
here; the launcher's own prediction (``GearPlan.expected_full_speed``) must match vLLM's answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleet.config import WorkerConfig, load_fleet
from fleet.perf import load_profile
from workers.vllm.launcher import MODEL_RUNNER_V2_ENV, build_launch, worker_gear_plan

from .probes import run_probe
from .test_gears import KIMI_FLEET, hopper_worker

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

PROBE = Path(__file__).with_name("capture_probe.py")
PROBE_TIMEOUT_S = 180.0
MUST_HAVE_GEARS = {0, 1, 2, 3, 5, 7}
"""Issue 14: on the K3 recipe, at least these k at full speed across every batch size it allows (k_max = 7)."""


def probe(argv: list[str], env: dict[str, str], model_dir: Path) -> dict[str, Any]:
    """vLLM's capture set for ``argv`` run with the launcher's ``env``.

    The launcher turns Model Runner V2 on; on CPU vLLM refuses it (no Triton), so the config is built without
    it. MRv2 changes no capture sizing in ``VllmConfig``: it only stops V1's PIECEWISE override, and the probe
    sets the mode MRv2 keeps (FULL_AND_PIECEWISE).
    """
    assert env.pop(MODEL_RUNNER_V2_ENV) == "1"
    return run_probe(PROBE, request={"argv": argv, "model": str(model_dir)}, env=env, timeout_s=PROBE_TIMEOUT_S)


def covered(rows: list[list[int]]) -> set[tuple[int, int]]:
    return {(k, bs) for k, lo, hi in rows for bs in range(lo, hi + 1)}


@pytest.fixture(scope="module")
def kimi() -> WorkerConfig:
    worker = load_fleet(KIMI_FLEET).worker("kimi-k3-0")
    assert worker is not None
    return worker


def test_k3_fleet_command_captures_every_gear_at_every_batch_size(kimi: WorkerConfig, tiny_model_dir: Path) -> None:
    plan = build_launch(kimi)
    answer = probe(list(plan.argv), dict(plan.env), tiny_model_dir)
    expected = worker_gear_plan(kimi).expected_full_speed()
    assert answer["full_speed"] == [list(row) for row in expected]
    assert covered(answer["full_speed"]) >= {(k, bs) for k in MUST_HAVE_GEARS for bs in range(1, kimi.max_num_seqs + 1)}
    assert answer["graphs"]["FULL"] == 8 * 32  # one decode graph per (k, batch size)


def test_the_fallback_table_still_captures_every_gear_at_every_batch_size(
    kimi: WorkerConfig, tiny_model_dir: Path
) -> None:
    """With the model's profile the start-up table is the fallback table (``fleet.fallback``): its sacrificial
    rows move, and every k 0…k_max still gets its decode graphs."""
    profile = load_profile("kimi-k3-dspark-tp16")
    plan = build_launch(kimi, profile=profile)
    answer = probe(list(plan.argv), dict(plan.env), tiny_model_dir)
    assert worker_gear_plan(kimi, profile).table != worker_gear_plan(kimi).table
    assert answer["full_speed"] == [list(row) for row in worker_gear_plan(kimi, profile).expected_full_speed()]
    assert covered(answer["full_speed"]) == {(k, bs) for k in range(8) for bs in range(1, kimi.max_num_seqs + 1)}


def test_hopper_command_is_bounded_by_eight_captured_tokens(tiny_model_dir: Path) -> None:
    worker = hopper_worker()
    plan = build_launch(worker)
    answer = probe(list(plan.argv), dict(plan.env), tiny_model_dir)
    assert answer["capture_sizes"] == list(range(1, 9))
    assert answer["full_speed"] == [list(row) for row in worker_gear_plan(worker).expected_full_speed()]
    assert (7, 2) not in covered(answer["full_speed"])  # a k = 7 verify of two sequences is 16 tokens


def test_the_old_one_row_table_captures_k_max_only(kimi: WorkerConfig, tiny_model_dir: Path) -> None:
    """Why the plan exists: ``[[1, max_num_seqs, k_max]]`` with vLLM's default sizes leaves k < k_max eager."""
    argv = list(build_launch(kimi).argv)
    at = argv.index("--speculative-config") + 1
    spec = json.loads(argv[at]) | {"num_speculative_tokens_per_batch_size": [[1, kimi.max_num_seqs, 7]]}
    argv[at] = json.dumps(spec)
    sizes = argv.index("--cudagraph-capture-sizes")
    end = next(i for i in range(sizes + 1, len(argv)) if argv[i].startswith("--"))
    del argv[sizes:end]
    answer = probe(argv, {MODEL_RUNNER_V2_ENV: "1"}, tiny_model_dir)
    assert answer["full_speed"] == [[7, 1, kimi.max_num_seqs]]
