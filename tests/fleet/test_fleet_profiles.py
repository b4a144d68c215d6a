"""Every fleet file in deploy/fleets runs the hardware and vLLM settings its model's profile assumes."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.config import FleetConfig, WorkerConfig, WorkerKind, load_fleet
from fleet.perf import Profile, load_profile

FLEETS = sorted((Path(__file__).resolve().parents[2] / "deploy" / "fleets").glob("*.yaml"))
VLLM_DEFAULTS = {"--kv-cache-dtype": "auto", "--gpu-memory-utilization": "0.9"}
"""What vLLM uses when a flag is absent (for the flags a profile states)."""


def flag(worker: WorkerConfig, name: str) -> str | None:
    """The value of ``name`` in the worker's extra_args (``--flag value`` or ``--flag=value``), or vLLM's default."""
    args = worker.extra_args
    for i, arg in enumerate(args):
        if arg == name:
            return args[i + 1]
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    return VLLM_DEFAULTS.get(name)


def vllm_workers(fleet: FleetConfig) -> list[tuple[WorkerConfig, Profile, int]]:
    models = {m.name: m for m in fleet.models}
    return [
        (w, load_profile(models[w.model].profile), models[w.model].context_window)
        for w in fleet.workers
        if w.kind is WorkerKind.VLLM
    ]


def test_there_is_a_fleet_file_per_shipped_recipe() -> None:
    profiles = {p.name for path in FLEETS for _, p, _ in vllm_workers(load_fleet(path))}
    assert profiles == {"kimi-k3-dspark-tp16", "kimi-k3-dspark-mi355x-tp8"}


@pytest.mark.parametrize("path", FLEETS, ids=[p.stem for p in FLEETS])
def test_workers_agree_with_their_profile(path: Path) -> None:
    workers = vllm_workers(load_fleet(path))
    assert workers, f"{path.name}: no vLLM worker"
    for worker, profile, context_window in workers:
        s = profile.serving
        assert (worker.gpus, worker.tensor_parallel_size) == (profile.hardware.gpus, s.tensor_parallel_size)
        assert worker.max_num_seqs == s.max_num_seqs
        assert worker.drafter.k_max == profile.drafter.k_max
        assert context_window == s.max_model_len == int(flag(worker, "--max-model-len") or 0)
        assert float(flag(worker, "--gpu-memory-utilization") or 0) == s.gpu_memory_utilization
        assert flag(worker, "--kv-cache-dtype") == s.kv_cache_dtype
        budget = flag(worker, "--max-num-batched-tokens")
        assert budget is None or int(budget) == profile.chunked_prefill_tokens


def test_a_disagreeing_worker_is_caught() -> None:
    worker, profile, _ = vllm_workers(load_fleet(FLEETS[0]))[0]
    other = worker.model_copy(update={"extra_args": ("--kv-cache-dtype=bfloat16",)})
    assert flag(other, "--kv-cache-dtype") != profile.serving.kv_cache_dtype
    assert flag(other, "--gpu-memory-utilization") == "0.9"
