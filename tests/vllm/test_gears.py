"""The GPU gear plan: a start-up row and exact decode capture sizes for every k (pure; vLLM's check is in
test_capture_coverage.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.config import DrafterConfig, WorkerConfig, WorkerKind, load_fleet
from fleet.speculation import dense_lookup
from workers.vllm.gears import gear_plan
from workers.vllm.launcher import LaunchError, build_launch, worker_gear_plan

KIMI_FLEET = Path(__file__).resolve().parents[2] / "deploy" / "fleets" / "kimi-k3-dspark.yaml"
HOPPER_ARGS = ("--max-cudagraph-capture-size", "8")


def option_values(argv: tuple[str, ...], flag: str) -> list[str]:
    start = argv.index(flag) + 1
    end = next((i for i in range(start, len(argv)) if argv[i].startswith("--")), len(argv))
    return list(argv[start:end])


def hopper_worker(*, max_num_seqs: int = 8, extra: tuple[str, ...] = HOPPER_ARGS) -> WorkerConfig:
    """The K3 recipe on Hopper: DSpark 7, --max-num-seqs 8, --max-cudagraph-capture-size 8."""
    return WorkerConfig(
        id="k3-hopper",
        url="http://10.0.0.1:8000",
        model="kimi-k3",
        kind=WorkerKind.VLLM,
        drafter=DrafterConfig(method="dspark", k_max=7, model="inferact/Kimi-K3-DSpark"),
        max_num_seqs=max_num_seqs,
        extra_args=extra,
    )


def test_k3_plan_gives_every_gear_a_start_up_row_and_every_decode_size() -> None:
    worker = load_fleet(KIMI_FLEET).worker("kimi-k3-0")
    assert worker is not None
    plan = worker_gear_plan(worker)
    assert (plan.k_max, plan.max_num_seqs, plan.ceiling) == (7, 32, 256)
    assert plan.table == ((1, 25, 7), (26, 26, 6), (27, 27, 5), (28, 28, 4), (29, 29, 3), (30, 30, 2), (31, 31, 1),
                          (32, 32, 0))  # fmt: skip
    assert set(dense_lookup(plan.table, max_num_seqs=32)[1:]) == set(range(8))
    assert plan.expected_full_speed() == tuple((k, 1, 32) for k in range(8))
    assert {n * (k + 1) for k in range(8) for n in range(1, 33)} == set(plan.capture_sizes)


def test_hopper_plan_stays_within_eight_tokens() -> None:
    plan = worker_gear_plan(hopper_worker())
    assert plan.table == tuple((8 - k, 8 - k, k) for k in range(7, -1, -1))
    assert plan.capture_sizes == (1, 2, 3, 4, 5, 6, 7, 8)
    # A k = 7 verify of two sequences is 16 tokens: past the ceiling, so k 7 is full speed only at batch size 1.
    assert plan.expected_full_speed() == (
        (0, 1, 8), (1, 1, 4), (2, 1, 2), (3, 1, 2), (4, 1, 1), (5, 1, 1), (6, 1, 1), (7, 1, 1)
    )  # fmt: skip


def test_too_few_batch_sizes_keep_k_max_off_and_the_short_gears() -> None:
    plan = gear_plan(k_max=7, max_num_seqs=4)
    assert plan.gears == (0, 1, 2, 7)
    assert plan.table == ((1, 1, 7), (2, 2, 2), (3, 3, 1), (4, 4, 0))
    assert {k for k, _, _ in plan.expected_full_speed()} == {0, 1, 2, 7}


def test_a_named_ceiling_is_a_capture_size_so_vllm_accepts_both() -> None:
    plan = gear_plan(k_max=3, max_num_seqs=2, extra_args=("--max-cudagraph-capture-size=100",))
    assert plan.capture_sizes[-1] == plan.ceiling == 100
    assert max(size for size in plan.capture_sizes if size != 100) == 8


def test_the_gpu_launch_writes_the_plan_and_model_runner_v2() -> None:
    worker = hopper_worker()
    plan = build_launch(worker)
    spec = json.loads(plan.argv[plan.argv.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens_per_batch_size"] == [list(r) for r in worker_gear_plan(worker).table]
    assert option_values(plan.argv, "--cudagraph-capture-sizes") == [str(s) for s in range(1, 9)]
    assert plan.argv[-2:] == HOPPER_ARGS
    assert plan.env["VLLM_USE_V2_MODEL_RUNNER"] == "1"


def test_capture_sizes_in_extra_args_and_a_bad_ceiling_are_refused() -> None:
    with pytest.raises(LaunchError, match="--cudagraph-capture-sizes is written by the launcher"):
        build_launch(hopper_worker(extra=("--cudagraph-capture-sizes", "1", "2")))
    with pytest.raises(LaunchError, match="must be an integer"):
        build_launch(hopper_worker(extra=("--max-cudagraph-capture-size", "eight")))
