"""Run with ``.venv-vllm``'s python: the idle-drafter skip on vLLM 0.32's Model Runner V2 classes, without a GPU.

Prints one JSON object. What it does, with vLLM's own classes and the plugin's own install path:

- installs the skip (``workers.vllm.idle_drafter.install``), imports MRv2's runner module, and reports which of
  its methods (and ``CudaGraphManager``'s) the plugin wrapped;
- DSpark: a ``DSparkSpeculator`` made without its GPU ``__init__``, holding CPU tensors, a model that records
  its context-KV stores, and raising stand-ins for the query-block forward; vLLM's ``DFlashSpeculator.propose``
  is counted. ``idle_v2.attach`` puts the skip in front of it; a step at k = 0 and one at k_max go through it.
  Only vLLM's Triton ``prepare_dflash_inputs`` is replaced (a recorder), since it cannot run on a CPU;
- a standalone draft model (``StandaloneARSpeculator``, vLLM's own ``propose``) with recording ``_prefill`` and
  ``_multi_step_decode``: which steps run at k = 2 and k = 0 of k_max = 4.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any

import torch

from workers.vllm import idle_drafter, idle_v2
from workers.vllm.settings import IdleDrafter


def installed() -> dict[str, Any]:
    """The methods of MRv2's runner and graph manager that ``install`` replaced (module imported first, so the
    install patches it at once, as when vLLM imported it before the plugin loaded)."""
    from vllm.v1.worker.gpu import cudagraph_utils, model_runner

    classes = {"GPUModelRunner": model_runner.GPUModelRunner, "CudaGraphManager": cudagraph_utils.CudaGraphManager}
    before = {name: dict(vars(cls)) for name, cls in classes.items()}
    idle_drafter.install(IdleDrafter.SKIP)
    return {
        name: sorted(attr for attr, value in vars(cls).items() if before[name].get(attr) is not value)
        for name, cls in classes.items()
    }


class RecordingModel:
    def __init__(self) -> None:
        self.stored: list[int] = []

    def precompute_and_store_context_kv(self, hidden: torch.Tensor, positions: torch.Tensor, slots: Any) -> None:
        self.stored.append(int(hidden.shape[0]))


def raiser(name: str) -> Any:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"{name} ran")

    return fail


def dspark() -> dict[str, Any]:
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    calls = {"propose": 0, "prepare_inputs": 0}
    original = DFlashSpeculator.propose

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["propose"] += 1
        return original(self, *args, **kwargs)

    DFlashSpeculator.propose = counted
    num_reqs, k_max, tokens, hidden = 3, 7, 3, 16
    spec = DSparkSpeculator.__new__(DSparkSpeculator)
    spec.model = RecordingModel()
    spec.hidden_states = torch.zeros(64, hidden)
    spec.context_positions = torch.zeros(64, dtype=torch.int64)
    spec._context_slot_mappings = torch.zeros(1, 64, dtype=torch.int64)
    spec._layer_group_idx = None
    spec.draft_tokens = torch.zeros(8, k_max, dtype=torch.int64)
    spec.pcp_manager = None
    spec.draft_kv_cache_group_ids = [0]
    spec.block_tables = SimpleNamespace(
        slot_mappings=[None], input_block_tables=[None], block_sizes=[16], cp_rank=0, cp_interleave=1
    )
    for name in ("input_buffers", "sample_indices", "sample_pos", "sample_idx_mapping", "temperature", "seeds"):
        setattr(spec, name, None)
    spec.dcp_size, spec.parallel_drafting_token_id, spec.num_query_per_req = 1, 0, k_max
    spec.num_speculative_steps, spec.max_num_reqs, spec.max_num_tokens, spec.max_model_len = k_max, 8, 64, 1024
    spec.sample_from_anchor = True
    spec._generate_draft = raiser("the query-block forward")
    spec.query_cudagraph_manager = SimpleNamespace(run_fullgraph=raiser("the query-block graph"))

    def prepare_inputs(*args: Any) -> None:
        calls["prepare_inputs"] += 1

    runner = SimpleNamespace(speculator=spec, adaptive_verification=None)
    skip = idle_v2.attach(runner, prepare_inputs=prepare_inputs)
    batch = SimpleNamespace(num_reqs=num_reqs, num_tokens=tokens, idx_mapping=torch.arange(num_reqs))
    step = (batch, {}, {}, torch.ones(tokens, hidden), None, *(torch.zeros(8) for _ in range(6)))
    drafts = spec.propose(*step, dp_sync_state=None, mm_inputs=None, num_speculative_tokens=0)
    at_zero = {
        "propose_calls": calls["propose"],
        "prepare_inputs_calls": calls["prepare_inputs"],
        "context_rows_stored": spec.model.stored,
        "drafts_all_masked": bool((drafts == -1).all()) and list(drafts.shape) == [num_reqs, k_max],
        "skipped_steps": skip.skipped_steps if skip else None,
    }
    failure: str | None = None
    try:  # vLLM's own propose at k_max: it cannot finish on a CPU, but it must be the one that runs
        spec.propose(*step, dp_sync_state=None, mm_inputs=None, num_speculative_tokens=k_max)
    except Exception as exc:
        failure = type(exc).__name__
    return {"family": skip.family if skip else None, "k0": at_zero, "kmax_propose_calls": calls["propose"],
            "kmax_failure": failure}  # fmt: skip


def standalone() -> dict[str, Any]:
    from vllm.v1.worker.gpu.spec_decode.standalone_ar.speculator import StandaloneARSpeculator

    spec = StandaloneARSpeculator.__new__(StandaloneARSpeculator)
    seen: list[tuple[str, int]] = []
    spec.model = object()
    spec.num_speculative_steps = 4
    spec.draft_tokens = torch.zeros(8, 4, dtype=torch.int64)
    spec._copy_request_inputs = lambda *a, **k: None
    spec._prefill = lambda *a, **k: seen.append(("prefill", spec.num_speculative_steps))
    spec._multi_step_decode = lambda *a, **k: seen.append(("decode", spec.num_speculative_steps))
    skip = idle_v2.attach(SimpleNamespace(speculator=spec, adaptive_verification=None))
    batch = SimpleNamespace(num_reqs=2, idx_mapping=torch.arange(2))
    step = (batch, {}, {}, None, None, *(torch.zeros(8) for _ in range(6)))
    result: dict[str, Any] = {"family": skip.family if skip else None}
    for k in (2, 0, 4):
        seen.clear()
        drafts = spec.propose(*step, dp_sync_state=None, mm_inputs=None, num_speculative_tokens=k)
        result[f"k{k}"] = {
            "steps": [list(s) for s in seen],
            "restored": spec.num_speculative_steps,
            "masked_from": k if k < 4 else None,
            "tail_masked": bool((drafts[:, k:] == -1).all()) if k < 4 else None,
        }
    return result


if __name__ == "__main__":
    answer = {"installed": installed(), "dspark": dspark(), "standalone": standalone()}
    sys.stdout.write(json.dumps(answer) + "\n")
