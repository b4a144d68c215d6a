"""From vLLM 0.32's source: with DSpark our k masks drafted positions ≥ k, it never shortens the drafted block.

No GPU here, so the proof is read off the code the GPU runs (parsed, not imported): Model Runner V2 hands the
step's k (``num_spec_tokens_to_schedule``, our table's value) to the speculator, then overwrites positions ≥ k
with -1 and stores the full-width block; DSpark's proposer (DFlash's ``propose``, which DSpark inherits) never
reads the k it is given, so it always drafts ``num_speculative_tokens`` positions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from workers.vllm.cpu_server import VLLM_VENV

pytestmark = pytest.mark.vllm


def vllm_source(relative: str) -> ast.Module:
    (path,) = sorted(VLLM_VENV.glob(f"lib/python3.*/site-packages/vllm/{relative}"))
    return ast.parse(Path(path).read_text())


def function(tree: ast.AST, name: str, *, within: str | None = None) -> ast.FunctionDef:
    scope: ast.AST = tree
    if within is not None:
        scope = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == within)
    return next(n for n in ast.walk(scope) if isinstance(n, ast.FunctionDef) and n.name == name)


def propose_calls(runner: ast.Module) -> list[tuple[ast.Call, list[str]]]:
    """Each ``with …: draft_tokens = self.speculator.propose(...)`` of the runner, with the statements after it."""
    found = []
    for node in ast.walk(runner):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for i, stmt in enumerate(body):
            if not isinstance(stmt, ast.With):
                continue
            for inner in stmt.body:
                value = getattr(inner, "value", None)
                if isinstance(value, ast.Call) and ast.unparse(value.func) == "self.speculator.propose":
                    found.append((value, [ast.unparse(s) for s in body[i + 1 :]]))
    return found


def test_model_runner_v2_masks_positions_at_and_past_k() -> None:
    steps = [
        after
        for call, after in propose_calls(vllm_source("v1/worker/gpu/model_runner.py"))
        if {kw.arg: ast.unparse(kw.value) for kw in call.keywords}.get("num_speculative_tokens") == "num_spec_tokens"
    ]
    assert len(steps) == 1, "expected one propose() that is handed the step's k"
    (after,) = steps
    assert after[0] == ("if num_spec_tokens < self.num_speculative_steps:\n    draft_tokens[:, num_spec_tokens:] = -1")
    # The whole block (num_speculative_steps wide) is kept, masked, not cut to k columns.
    assert after[1] == "self.req_states.draft_tokens[input_batch.idx_mapping] = draft_tokens"


def test_dspark_drafts_its_whole_block_whatever_k_it_is_given() -> None:
    dspark = vllm_source("v1/worker/gpu/spec_decode/dspark/speculator.py")
    speculator = next(n for n in ast.walk(dspark) if isinstance(n, ast.ClassDef) and n.name == "DSparkSpeculator")
    assert [ast.unparse(b) for b in speculator.bases] == ["DFlashSpeculator"]
    assert not any(isinstance(n, ast.FunctionDef) and n.name == "propose" for n in speculator.body)
    propose = function(
        vllm_source("v1/worker/gpu/spec_decode/dflash/speculator.py"), "propose", within="DFlashSpeculator"
    )
    assert "num_speculative_tokens" in [a.arg for a in propose.args.kwonlyargs + propose.args.args]
    reads = [n for stmt in propose.body for n in ast.walk(stmt) if isinstance(n, ast.Name)]
    assert "num_speculative_tokens" not in {n.id for n in reads}
    assert "self.num_speculative_steps" in ast.unparse(propose)  # the block width it drafts
