"""Install the idle-drafter skip into vLLM's model runners, in whichever vLLM process builds one.

The general plugin runs in every vLLM process (API server, EngineCore, model workers), but only the process that
builds a model runner needs the skip, and importing a runner module costs seconds. So the skip is attached when
vLLM itself imports the runner module: a ``sys.meta_path`` finder wraps the module's loader and patches the
module right after it executes (at once when it is already imported).

- V1 runner (``vllm.v1.worker.gpu_model_runner``, the CPU worker's): ``GPUModelRunner.propose_draft_token_ids``
  goes behind ``workers.vllm.idle_v1.with_skip``; ``_prepare_inputs`` and ``_calc_spec_decode_metadata``
  behind ``with_plain_step`` and ``with_plain_step_metadata`` (a step at k = 0 runs without speculative
  metadata), ``_sample`` behind ``with_plain_sampler`` (a step that verifies no drafts is sampled as without
  speculation), ``take_draft_token_ids`` behind ``with_quiet_take`` (the skip's empty drafts go unreported).
  ``IdleDrafter.SKIP_NO_CATCH_UP`` (an ablation) installs the same with the draft model's catch-up off.
- Model Runner V2 (``vllm.v1.worker.gpu.model_runner``, GPUs): ``GPUModelRunner.load_model`` wraps the built
  speculator's ``propose`` (``workers.vllm.idle_v2``).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from workers.vllm.settings import IdleDrafter

log = logging.getLogger("vllm.gearshift")

V1_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
V2_RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"
_PATCHED = "__gearshift_idle_drafter__"


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` right after ``name`` is first executed."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.patch = patch

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = None if spec is None else spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute = loader.exec_module
        patch = self.patch

        def exec_module(module: ModuleType) -> None:
            execute(module)
            patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _patch_once(module: ModuleType, patch: Callable[[ModuleType], None]) -> None:
    if getattr(module, _PATCHED, False):
        return
    try:
        patch(module)
    except Exception:  # never break vLLM because of the plugin: the drafter then runs as stock vLLM runs it
        log.exception("gearshift: installing the idle-drafter skip into %s failed; stock behaviour", module.__name__)
    setattr(module, _PATCHED, True)


def _patch_v1(module: ModuleType, *, catch_up: bool = True) -> None:
    from workers.vllm import idle_v1

    runner = module.GPUModelRunner
    setattr(runner, idle_v1.CATCH_UP_ATTR, catch_up)
    runner.propose_draft_token_ids = idle_v1.with_skip(runner.propose_draft_token_ids)
    runner._sample = idle_v1.with_plain_sampler(runner._sample)
    runner._prepare_inputs = idle_v1.with_plain_step(runner._prepare_inputs)
    runner._calc_spec_decode_metadata = idle_v1.with_plain_step_metadata(runner._calc_spec_decode_metadata)
    runner.take_draft_token_ids = idle_v1.with_quiet_take(runner.take_draft_token_ids)
    log.debug("gearshift: idle-drafter skip installed on the V1 runner")


def _patch_v2(module: ModuleType) -> None:
    from workers.vllm.idle_v2 import with_speculator_skip

    runner = module.GPUModelRunner
    runner.load_model = with_speculator_skip(runner.load_model)
    log.debug("gearshift: idle-drafter skip installed on Model Runner V2")


PATCHES: dict[str, Callable[[ModuleType], None]] = {V1_RUNNER_MODULE: _patch_v1, V2_RUNNER_MODULE: _patch_v2}


def install(mode: IdleDrafter, *, modules: dict[str, Any] | None = None) -> list[str]:
    """Arrange for the skip to be installed in each runner module (``mode`` SKIP, or SKIP_NO_CATCH_UP for the
    ablation); returns the module names it was installed in or will be on import. ``modules`` stands in for
    ``sys.modules`` in tests."""
    if mode is IdleDrafter.STOCK:
        return []
    patches = PATCHES
    if mode is IdleDrafter.SKIP_NO_CATCH_UP:
        log.warning("gearshift: idle-drafter skip WITHOUT its catch-up (an ablation: acceptance after k = 0 drops)")
        patches = {**PATCHES, V1_RUNNER_MODULE: functools.partial(_patch_v1, catch_up=False)}
    loaded = sys.modules if modules is None else modules
    for name, patch in patches.items():
        module = loaded.get(name)
        if module is not None:
            _patch_once(module, patch)
        elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
            sys.meta_path.insert(0, _AfterImport(name, lambda m, p=patch: _patch_once(m, p)))  # type: ignore[misc]
    return list(patches)
