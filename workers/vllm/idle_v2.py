"""The idle-drafter skip on vLLM 0.32's Model Runner V2 (``vllm/v1/worker/gpu/model_runner.py``), the GPU runner.
Imported only inside vLLM processes. UNCHECKED ON A GPU: written against the source, tested on it without one.

MRv2's ``sample_tokens`` calls ``self.speculator.propose(..., num_speculative_tokens=num_spec_tokens)`` every step
and then masks ``draft_tokens[:, num_spec_tokens:] = -1``. What each speculator does with k, from the source:

- DFlash / DSpark (``dflash/speculator.py``; DSpark inherits ``propose``): never reads k. Every step it
  (1) copies the target's hidden states, (2) ``prepare_dflash_inputs`` (context positions and slots, query
  slots), (3) stores the context KV (``_precompute_context_kv``: the drafter's K/V projections of the step's
  target tokens, the state later drafts attend to), (4) runs the query-block forward over
  ``num_query_per_req`` = k_max (+1) positions per request and samples. At k = 0 the skip runs (1)–(3) only,
  eagerly, and not ``propose``: the context stays current at the cost of a few projections per drafter layer.
- EAGLE / MTP (``target_dependent_ar``): already drafts k steps and, at k = 0, runs only its prefill pass (the
  state-keeping first forward, FULL-graph when the batch is a uniform decode) before filling -1: left as is.
- A standalone draft model (``standalone_ar``): never reads k; its ``_prefill`` writes the drafter's KV for the
  step, ``_multi_step_decode`` drafts ``num_speculative_steps - 1`` more. The skip bounds the loop to k (at
  k = 0, the prefill pass only): 1 drafter forward instead of k_max at k = 0.

Why DSpark keeps one block width (read from ``dflash/speculator.py``, ``dflash/cudagraph.py``,
``dspark/speculator.py``). The width is ``num_query_per_req`` (k_max for DSpark's anchor-as-first layout, k_max + 1
for DFlash's), fixed at construction. ``prepare_dflash_inputs`` takes it as a runtime argument (not a
``tl.constexpr``: no new kernel per width), but everything around the query forward is built for that one width:

- ``DFlashCudaGraphManager`` is built with ``decode_query_len=num_query_per_req`` and ``propose`` dispatches with
  ``uniform_token_count=self.num_query_per_req``: a narrower block finds no FULL graph and runs eager, unless the
  manager captured a graph set per width (k_max sets: k_max × the capture time and graph memory);
- the FULL graph also holds the decode's context-KV store ("the graph stores the first num_context context
  rows") and DSpark's sequential Markov sampling over ``num_speculative_steps`` columns (``_step_cols``,
  ``_anchor_idx`` strided by the width): both would need their per-width variants;
- a drafter whose query block attends non-causally (``dflash_has_any_non_causal``, ``get_draft_attn_causal``)
  drafts different tokens in a narrower block than in the first positions of the full one: the block it was
  trained on is the one whose acceptance the profiles carry.

Whether it would pay (ASSUMED, an estimate, not measured): the block's forward is B × k_max tokens through a
~3.56 B drafter. At batch ≤ 32 that is bound by reading the drafter's weights, nearly flat in width; at B = 128,
k_max = 7 it is ~2 × 3.56e9 × 896 ≈ 6.4 TFLOP over 8 GPUs, well under a millisecond against a K3 step of tens of
milliseconds, so a narrower block would save at most ~1–2 % of a step at any k > 0, for k_max graph sets and a
different draft distribution. It does not pay; only k = 0 (no block at all) does, and that is what the skip does.

The target's forward is chosen before any of this (``execute_model``: ``self.cudagraph_manager.dispatch`` from
the scheduler's k), so the skip never changes which graph the target replays.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("vllm.gearshift")

Propose = Callable[..., Any]


def _class_names(obj: Any) -> set[str]:
    return {cls.__name__ for cls in type(obj).__mro__}


def keep_dflash_context(
    speculator: Any,
    input_batch: Any,
    last_hidden_states: Any,
    aux_hidden_states: Any,
    num_sampled: Any,
    num_rejected: Any,
    last_sampled: Any,
    next_prefill_tokens: Any,
    temperature: Any,
    seeds: Any,
    *,
    prepare_inputs: Callable[..., None] | None = None,
) -> Any:
    """DFlash/DSpark at k = 0: steps (1)–(3) of ``DFlashSpeculator.propose`` (same calls, same arguments:
    tests/vllm/test_idle_v2.py checks them against vLLM's source), no query-block forward. Returns the draft
    buffer filled with -1. ``prepare_inputs`` stands in for vLLM's Triton ``prepare_dflash_inputs`` in tests."""
    if prepare_inputs is None:
        from vllm.v1.worker.gpu.spec_decode.dflash.speculator import prepare_dflash_inputs

        prepare_inputs = prepare_dflash_inputs
    self = speculator
    num_reqs = input_batch.num_reqs
    num_target_tokens = input_batch.num_tokens
    if aux_hidden_states:
        hidden_states = self.model.combine_hidden_states(torch.cat(aux_hidden_states, dim=-1))
    else:
        hidden_states = last_hidden_states
    self.hidden_states[:num_target_tokens].copy_(hidden_states[:num_target_tokens])
    self.prepare_context_anchor(input_batch, num_rejected)
    if self.pcp_manager is not None:
        self.block_tables.gather_block_tables(input_batch.idx_mapping, num_reqs_padded=num_reqs)
    for i, gid in enumerate(self.draft_kv_cache_group_ids):
        prepare_inputs(
            self.input_buffers,
            self.block_tables.slot_mappings[gid],
            self.context_positions,
            self._context_slot_mappings[i],
            self.sample_indices,
            self.sample_pos,
            self.sample_idx_mapping,
            self.temperature,
            self.seeds,
            input_batch,
            num_sampled,
            num_rejected,
            last_sampled,
            next_prefill_tokens,
            temperature,
            seeds,
            self.block_tables.input_block_tables[gid],
            self.block_tables.block_sizes[gid],
            self.block_tables.cp_rank,
            self.dcp_size,
            self.block_tables.cp_interleave,
            self.parallel_drafting_token_id,
            self.num_query_per_req,
            self.num_speculative_steps,
            self.max_num_reqs,
            self.max_num_tokens,
            self.max_model_len,
            self.sample_from_anchor,
        )
    self._precompute_context_kv(0, num_target_tokens)
    drafts = self.draft_tokens[:num_reqs]
    drafts.fill_(-1)
    return drafts


class SpeculatorSkip:
    """The skip in front of one MRv2 speculator's ``propose`` (installed on the instance, so ``isinstance``
    checks in the runner still see vLLM's class)."""

    def __init__(
        self,
        speculator: Any,
        original: Propose,
        *,
        family: str,
        runner: Any,
        prepare_inputs: Callable[..., None] | None = None,
    ) -> None:
        self.speculator = speculator
        self.original = original
        self.family = family
        self.runner = runner
        self.prepare_inputs = prepare_inputs
        """Stands in for vLLM's Triton ``prepare_dflash_inputs`` in tests (None: vLLM's)."""
        self.skipped_steps = 0

    def _may_skip(self, kwargs: dict[str, Any]) -> bool:
        """Only real steps of one engine: not dummy or profile runs, not under data parallelism (its ranks sync
        inside ``propose``), not with adaptive verification (it reads the drafts' confidences after ``propose``)."""
        return not (
            kwargs.get("dummy_run")
            or kwargs.get("is_profile")
            or kwargs.get("dp_sync_state") is not None
            or getattr(self.runner, "adaptive_verification", None) is not None
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        k = kwargs.get("num_speculative_tokens")
        if k is None or not self._may_skip(kwargs):
            return self.original(*args, **kwargs)
        if self.family == "dflash" and k == 0:
            self.skipped_steps += 1
            with torch.inference_mode():
                return keep_dflash_context(self.speculator, args[0], *args[3:11], prepare_inputs=self.prepare_inputs)
        if self.family == "standalone" and k < self.speculator.num_speculative_steps:
            return self._draft_k_steps(max(k, 1), args, kwargs)
        return self.original(*args, **kwargs)

    def _draft_k_steps(self, k: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A standalone draft model drafting k steps: its loop reads ``num_speculative_steps``, bounded for the call."""
        speculator = self.speculator
        full = speculator.num_speculative_steps
        speculator.num_speculative_steps = k
        try:
            self.original(*args, **kwargs)
        finally:
            speculator.num_speculative_steps = full
        num_reqs = args[0].num_reqs
        drafts = speculator.draft_tokens[:num_reqs]
        drafts[:, k:] = -1
        if kwargs.get("num_speculative_tokens") == 0:
            drafts.fill_(-1)
        return drafts


def family_of(speculator: Any) -> str | None:
    """ "dflash" (DFlash, DSpark), "standalone" (a draft model), or None (left as vLLM runs it)."""
    names = _class_names(speculator)
    if "DFlashSpeculator" in names and not {"LiLiCorrSpeculator", "DFlash2Speculator"} & names:
        return "dflash"
    if "StandaloneARSpeculator" in names:
        return "standalone"
    return None


def attach(runner: Any, *, prepare_inputs: Callable[..., None] | None = None) -> SpeculatorSkip | None:
    """Put the skip in front of ``runner.speculator.propose``; None when its method is left as is."""
    speculator = getattr(runner, "speculator", None)
    family = None if speculator is None else family_of(speculator)
    if speculator is None or family is None:
        log.info("gearshift: idle-drafter skip on Model Runner V2: none (stock) for %s", type(speculator).__name__)
        return None
    skip = SpeculatorSkip(speculator, speculator.propose, family=family, runner=runner, prepare_inputs=prepare_inputs)
    speculator.propose = skip
    log.info("gearshift: idle-drafter skip on Model Runner V2: %s (%s)", family, type(speculator).__name__)
    return skip


def with_speculator_skip(load_model: Callable[..., Any]) -> Callable[..., Any]:
    """MRv2 ``GPUModelRunner.load_model``, then the skip on the speculator it loaded."""

    @functools.wraps(load_model)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = load_model(self, *args, **kwargs)
        try:
            attach(self)
        except Exception:  # never break vLLM because of the plugin
            log.exception("gearshift: attaching the idle-drafter skip failed; stock behaviour")
        return result

    return wrapped
