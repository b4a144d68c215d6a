"""How the idle-drafter skip gets into a vLLM process, and what it relies on in vLLM 0.32's V1 runner source.

The install path runs here without vLLM (a throwaway module stands in for a runner module: the mechanism, an
import hook, is what is tested). The V1 facts are read off vLLM's source, parsed, not imported.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from workers.vllm import idle_drafter
from workers.vllm.settings import IdleDrafter, VllmPluginSettings

from .test_dspark_masking import function, vllm_source


@pytest.fixture
def fake_runner_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package ``gsfake`` with a module ``runner`` holding ``GPUModelRunner``, importable and not yet imported;
    the skip's patch table names it instead of vLLM's modules."""
    pkg = tmp_path / "gsfake"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "runner.py").write_text(
        "class GPUModelRunner:\n    def propose_draft_token_ids(self):\n        return 'x'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    calls: list[str] = []

    def patch(module: ModuleType) -> None:
        calls.append(module.__name__)
        module.GPUModelRunner.patched = True

    monkeypatch.setattr(idle_drafter, "PATCHES", {"gsfake.runner": patch})
    finders = list(sys.meta_path)
    yield "gsfake.runner"
    sys.meta_path[:] = finders
    for name in ("gsfake.runner", "gsfake"):
        sys.modules.pop(name, None)


def test_the_skip_is_patched_in_when_the_runner_module_is_first_imported(fake_runner_package: str) -> None:
    assert idle_drafter.install(IdleDrafter.SKIP) == [fake_runner_package]
    assert fake_runner_package not in sys.modules  # nothing imported by the install itself
    import gsfake.runner  # type: ignore[import-not-found]

    assert gsfake.runner.GPUModelRunner.patched is True
    assert getattr(gsfake.runner, "__gearshift_idle_drafter__", False)
    idle_drafter.install(IdleDrafter.SKIP)  # again: patched once, no second finder
    assert sum(isinstance(f, idle_drafter._AfterImport) for f in sys.meta_path) == 1


def test_an_already_imported_runner_module_is_patched_at_once(fake_runner_package: str) -> None:
    import gsfake.runner

    idle_drafter.install(IdleDrafter.SKIP)
    assert gsfake.runner.GPUModelRunner.patched is True
    assert not any(isinstance(f, idle_drafter._AfterImport) for f in sys.meta_path)


def test_stock_mode_installs_nothing(fake_runner_package: str) -> None:
    assert idle_drafter.install(IdleDrafter.STOCK) == []
    import gsfake.runner

    assert not hasattr(gsfake.runner.GPUModelRunner, "patched")


def test_the_skip_is_on_by_default_and_stock_is_one_variable_away(monkeypatch: pytest.MonkeyPatch) -> None:
    assert VllmPluginSettings().idle_drafter is IdleDrafter.SKIP
    monkeypatch.setenv("GEARSHIFT_IDLE_DRAFTER", "stock")
    assert VllmPluginSettings().idle_drafter is IdleDrafter.STOCK
    monkeypatch.setenv("GEARSHIFT_IDLE_DRAFTER", "sometimes")
    with pytest.raises(ValueError, match="idle_drafter"):
        VllmPluginSettings()


@pytest.mark.vllm
def test_v1_calls_propose_draft_token_ids_positionally_in_the_order_the_skip_reads() -> None:
    """``idle_v1`` reads ``args[0]`` scheduler output, ``args[1]`` sampled ids, ``args[6]`` spec-decode metadata,
    ``args[7]`` the drafter's attention metadata."""
    runner = vllm_source("v1/worker/gpu_model_runner.py")
    method = function(runner, "propose_draft_token_ids", within="GPUModelRunner")
    names = [a.arg for a in method.args.args]
    assert names[1:3] == ["scheduler_output", "sampled_token_ids"]
    assert names[7:9] == ["spec_decode_metadata", "common_attn_metadata"]
    calls = [
        n
        for n in ast.walk(function(runner, "sample_tokens", within="GPUModelRunner"))
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "self.propose_draft_token_ids"
    ]
    assert len(calls) == 1
    assert not calls[0].keywords
    assert len(calls[0].args) == len(names) - 1


@pytest.mark.vllm
def test_stock_v1_runs_the_drafters_first_forward_at_k0_which_is_the_tax_the_skip_removes() -> None:
    """``SpecDecodeBaseProposer.propose`` runs the model, then returns no draft when k = 0; its decode loop
    already runs k - 1 steps, not ``num_speculative_tokens`` of the start-up config."""
    propose = ast.unparse(
        function(vllm_source("v1/spec_decode/llm_base_proposer.py"), "propose", within="SpecDecodeBaseProposer")
    )
    forward = propose.index("ret_hidden_states = self.model(**model_kwargs)")
    at_zero = propose.index("if self.num_speculative_tokens == 0:")
    assert forward < at_zero
    assert "self.num_speculative_tokens = num_speculative_tokens" in propose
    assert "for token_index in range(self.num_speculative_tokens - 1):" in propose
