"""The idle-drafter skip on Model Runner V2, checked on vLLM 0.32's own source and classes (no GPU here).

With every request at k = 0 on the K3 recipe (DSpark): vLLM's ``propose`` is not called, only the context-KV store
runs, and the target's decode still dispatches to a captured FULL graph at every batch size, because the skip
replaces nothing that chooses the target's graph. What only a GPU can show (MRv2 timings, graph capture with the
skip, the context store on real weights) is not checked here.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from fleet.config import WorkerConfig, load_fleet
from workers.vllm.cpu_server import REPO_ROOT
from workers.vllm.launcher import build_launch

from .probes import run_probe
from .test_capture_coverage import covered, probe
from .test_dspark_masking import function, vllm_source
from .test_gears import KIMI_FLEET

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

IDLE_PROBE = Path(__file__).with_name("idle_probe.py")


@pytest.fixture(scope="module")
def idle(vllm_env: None) -> dict[str, Any]:
    return run_probe(IDLE_PROBE)


@pytest.fixture(scope="module")
def kimi() -> WorkerConfig:
    worker = load_fleet(KIMI_FLEET).worker("kimi-k3-0")
    assert worker is not None
    return worker


@pytest.mark.heavy
def test_at_k0_dspark_stores_its_context_and_vllm_propose_does_not_run(idle: dict[str, Any]) -> None:
    dspark = idle["dspark"]
    assert dspark["family"] == "dflash"
    k0 = dspark["k0"]
    assert k0["propose_calls"] == 0
    assert k0["prepare_inputs_calls"] == 1  # one draft KV-cache group
    assert k0["context_rows_stored"] == [3]  # every target token of the step, eagerly
    assert k0["drafts_all_masked"]
    assert k0["skipped_steps"] == 1
    assert dspark["kmax_propose_calls"] == 1  # at k_max vLLM's own propose runs (it cannot finish on a CPU)


@pytest.mark.heavy
def test_a_standalone_draft_model_drafts_k_steps_and_only_its_prefill_at_k0(idle: dict[str, Any]) -> None:
    standalone = idle["standalone"]
    assert standalone["family"] == "standalone"
    assert standalone["k2"]["steps"] == [["prefill", 2], ["decode", 2]]
    assert standalone["k2"]["tail_masked"]
    assert standalone["k0"]["steps"] == [["prefill", 1]]
    assert standalone["k0"]["tail_masked"]
    assert standalone["k4"]["steps"] == [["prefill", 4], ["decode", 4]]
    assert {standalone[k]["restored"] for k in ("k0", "k2", "k4")} == {4}


@pytest.mark.heavy
def test_the_skip_replaces_nothing_that_chooses_the_targets_graph(idle: dict[str, Any]) -> None:
    assert idle["installed"] == {"GPUModelRunner": ["load_model"], "CudaGraphManager": []}
    runner = vllm_source("v1/worker/gpu/model_runner.py")
    execute = ast.unparse(function(runner, "execute_model", within="GPUModelRunner"))
    sample = ast.unparse(function(runner, "sample_tokens", within="GPUModelRunner"))
    assert "self.cudagraph_manager.dispatch(" in execute or "dispatch_cg_and_sync_dp(" in execute
    assert "self.speculator.propose(" in sample  # an attribute of the instance: the skip's wrapper is what runs
    assert "cudagraph_manager" not in sample


@pytest.mark.heavy
def test_at_k0_the_targets_decode_still_replays_a_captured_graph(kimi: WorkerConfig, tiny_model_dir: Path) -> None:
    plan = build_launch(kimi)
    answer = probe(list(plan.argv), dict(plan.env), tiny_model_dir)
    assert {(0, bs) for bs in range(1, kimi.max_num_seqs + 1)} <= covered(answer["full_speed"])


def test_the_context_store_calls_prepare_inputs_exactly_as_vllm_propose_does() -> None:
    """``keep_dflash_context`` mirrors steps (1)–(3) of ``DFlashSpeculator.propose``; a vLLM upgrade that changes
    them fails here, not silently on a GPU."""
    propose = function(
        vllm_source("v1/worker/gpu/spec_decode/dflash/speculator.py"), "propose", within="DFlashSpeculator"
    )
    mine = function(ast.parse((REPO_ROOT / "workers/vllm/idle_v2.py").read_text()), "keep_dflash_context")

    def call_args(tree: ast.AST, name: str) -> list[str]:
        (call,) = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == name]
        return [ast.unparse(a) for a in call.args]

    assert call_args(propose, "prepare_dflash_inputs") == call_args(mine, "prepare_inputs")
    theirs = ast.unparse(propose)
    for step in (
        "self.hidden_states[:num_target_tokens].copy_(hidden_states[:num_target_tokens])",
        "self.prepare_context_anchor(input_batch, num_rejected)",
        "self._precompute_context_kv(0, num_target_tokens",
        "for i, gid in enumerate(self.draft_kv_cache_group_ids):",
    ):
        assert step in theirs
        assert step in ast.unparse(mine)
