"""The idle-drafter skip on vLLM 0.32's V1 model runner (``vllm/v1/worker/gpu_model_runner.py``), the runner the
CPU worker runs (``CPUModelRunner(GPUModelRunner)``). Imported only inside vLLM processes (it imports torch).

What stock V1 does at k = 0 (``scheduler_output.num_spec_tokens_to_schedule == 0``), read from its source:
``sample_tokens`` still calls ``propose_draft_token_ids``; for a draft model (``SpecDecodeBaseProposer.propose``)
that runs the first forward over the step's tokens "to keep the drafter KV cache in sync" and returns no draft;
for ngram it runs the n-gram search over every context (numba, all cores). At k > 0 it already drafts k steps,
not ``num_speculative_tokens`` (``for token_index in range(self.num_speculative_tokens - 1)`` after
``self.num_speculative_tokens = num_speculative_tokens``).

What the skip changes, for the two methods it knows (others keep stock behaviour, which for EAGLE/MTP is
already "run only the state-keeping first pass"):

- ``ngram``: at k = 0 nothing runs (it has no state: it reads the token ids every step).
- ``draft_model``: at k = 0, on a step that verifies no drafts (the step where k drops still verifies the
  previous step's; vLLM builds ``SpecDecodeMetadata`` with zero drafts on the others), only the bookkeeping the
  runner needs for its next step runs, and the step's token ids and positions are stashed (device tensors,
  exact under async scheduling, where the CPU copies hold placeholders). That bookkeeping is
  ``prepare_next_token_ids_padded`` and ``_copy_valid_sampled_token_count``, and only under async scheduling:
  without it (the CPU worker: vLLM's CPU platform turns async scheduling off) the copy returns at once and
  nothing reads the next token ids, so vLLM itself skips both when the input does not fit the drafter. The
  first step at k > 0 replays every stashed position of each request in one batched drafter forward (a
  prefill of the hole, chunked to the token budget) before drafting, so the drafter's KV is what it would
  have been. Cost: one drafter prefill of the positions skipped, once per return
  to k > 0, against one drafter forward per step on every skipped step.

Steps without drafts run as without speculation. The profile of k = 0 (``workers.vllm.profile_idle``) named
what the skip left per step: stock V1 builds ``SpecDecodeMetadata`` for zero drafts and sends the step through
the rejection sampler, whose output for zero drafts is the bonus token it samples with the same sampler, logits
and generators (it draws no random numbers for a request without drafts), plus kernels and copies that change
nothing. So (both only where the sampling needs nothing else of the rejection sampler: no logprobs, thinking
budget or synthetic acceptance):

- a step at k = 0 that schedules no draft gets no metadata at all (``with_plain_step``: ``_prepare_inputs``
  returns None for it, with the logits indices a runner without speculation computes); its sampler is the
  plain one, and the skip's proposal, the only other reader, reads none;
- any other step that verifies no drafts (the first at k > 0, a prefill) is sampled by the plain sampler
  (``with_plain_sampler``).

- and the skip's empty proposal is not reported to the scheduler (``no_drafts``, ``with_quiet_take``):
  without async scheduling vLLM copied the empty draft tensor to the CPU, read it back and set every
  request's drafts to the empty list they already had.

Model Runner V2 does this already (``sample``: the plain sampler when ``input_batch.num_draft_tokens == 0``).

The ablation ``GEARSHIFT_IDLE_DRAFTER=skip-no-catch-up`` (``CATCH_UP_ATTR`` False on the runner class) skips as
above but records nothing for the catch-up: the acceptance check shows what the drafter's hole costs.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from workers.vllm.drafter_lag import CatchUp, DrafterLag, pack

log = logging.getLogger("vllm.gearshift")

_SKIP_ATTR = "_gearshift_idle_drafter"
CATCH_UP_ATTR = "_gearshift_catch_up"
"""Set on the runner class by the install: False for the ablation ``IdleDrafter.SKIP_NO_CATCH_UP``."""
_PLAIN_STEP_ATTR = "_gearshift_plain_step"
_NO_DRAFTS_ATTR = "_gearshift_no_drafts"
"""The skip's last ``no_drafts`` list, until ``take_draft_token_ids`` (``with_quiet_take``) sees it."""
"""Set by ``with_plain_step`` for the length of one ``_prepare_inputs``: the step runs without speculation."""
_PRUNE_EVERY = 64
"""Skipped steps between drops of finished requests from the ledger (and their stashed tensors)."""

Original = Callable[..., Any]


class NgramSkip:
    """ngram at k = 0: no search (it keeps no state)."""

    def propose(self, original: Original, runner: Any, args: tuple[Any, ...]) -> Any:
        scheduler_output = args[0]
        if scheduler_output.num_spec_tokens_to_schedule == 0:
            return no_drafts(runner, runner.input_batch.num_reqs)
        return original(runner, *args)


class DraftModelSkip:
    """draft_model at k = 0: no drafter forward; the positions it missed are replayed when k returns
    (``catch_up``; False only for the ablation, which leaves the drafter's KV with a hole)."""

    def __init__(self, *, catch_up: bool = True) -> None:
        self.catch_up = catch_up
        self.lag = DrafterLag()
        self._stash: dict[int, tuple[Any, Any]] = {}
        self._skips = 0
        self.replayed_tokens = 0
        """Positions replayed so far (the catch-up's work, for logs and tests)."""

    def propose(self, original: Original, runner: Any, args: tuple[Any, ...]) -> Any:
        scheduler_output, sampled_token_ids = args[0], args[1]
        spec_decode_metadata, common_attn_metadata = args[6], args[7]
        if scheduler_output.num_spec_tokens_to_schedule == 0 and not verifies_drafts(spec_decode_metadata):
            return self._skip(runner, scheduler_output, sampled_token_ids)
        if self.lag:  # a step that verifies drafts, or the first at k > 0: the drafter must see every position
            self._catch_up(runner, common_attn_metadata)
        return original(runner, *args)

    def _skip(self, runner: Any, scheduler_output: Any, sampled_token_ids: Any) -> Any:
        batch = runner.input_batch
        num_reqs = batch.num_reqs
        if runner.valid_sampled_token_count_event is not None:  # async scheduling: the next step reads them
            next_token_ids, valid_counts = runner.drafter.prepare_next_token_ids_padded(
                sampled_token_ids, runner.requests, batch, runner.discard_request_mask.gpu
            )
            runner._copy_valid_sampled_token_count(next_token_ids, valid_counts)
        self._skips += 1
        if self._skips == 1:
            log.info("gearshift: idle-drafter skip: first step without a drafter forward (k = 0)")
        if self.catch_up:
            self._record(runner, scheduler_output)
        return no_drafts(runner, num_reqs)

    def _record(self, runner: Any, scheduler_output: Any) -> None:
        """Note the step's positions in the ledger and stash its token ids and positions, for the catch-up."""
        batch = runner.input_batch
        num_reqs = batch.num_reqs
        num_tokens = scheduler_output.total_num_scheduled_tokens
        step = self.lag.skipped(
            batch.req_ids[:num_reqs], runner.query_start_loc.np[: num_reqs + 1], batch.num_computed_tokens_cpu
        )
        self._stash[step] = (
            runner.input_ids.gpu[:num_tokens].clone(),
            runner._get_positions(num_tokens).clone(),
        )
        if self._skips % _PRUNE_EVERY == 0:
            self._prune(runner)

    def _prune(self, runner: Any) -> None:
        self.lag.forget_all_but(runner.requests)
        used = self.lag.stashes_in_use()
        for step in [s for s in self._stash if s not in used]:
            del self._stash[step]

    def _catch_up(self, runner: Any, common_attn_metadata: Any) -> None:
        batch = runner.input_batch
        num_reqs = batch.num_reqs
        due = self.lag.due(batch.req_ids[:num_reqs], batch.num_computed_tokens_cpu)
        drafter = runner.drafter
        with torch.inference_mode():
            for forward in pack(due, max_tokens=drafter.max_num_tokens):
                self._replay(drafter, common_attn_metadata, forward)
        replayed = sum(c.length for c in due)
        self.replayed_tokens += replayed
        if due:
            log.info("gearshift: idle-drafter catch-up: replayed %d positions of %d requests", replayed, len(due))
        self._prune(runner)

    def _replay(self, drafter: Any, cad: Any, forward: list[tuple[CatchUp, int, int]]) -> None:
        """One drafter forward over ``forward``'s pieces: each a prefill chunk of its request, attending to the
        request's earlier positions in the KV cache and writing the drafter's KV for its own."""
        from vllm.config.compilation import CUDAGraphMode
        from vllm.forward_context import set_forward_context
        from vllm.v1.attention.backend import CommonAttentionMetadata

        ids, positions, rows, lengths, seq_lens = [], [], [], [], []
        for catch_up, start, stop in forward:
            for seg in catch_up.segments:
                lo, hi = max(seg.first, start), min(seg.end, stop)
                if lo < hi:
                    stash_ids, stash_pos = self._stash[seg.step]
                    a = seg.offset + lo - seg.first
                    ids.append(stash_ids[a : a + hi - lo])
                    positions.append(stash_pos[a : a + hi - lo])
            rows.append(catch_up.row)
            lengths.append(stop - start)
            seq_lens.append(stop)
        device = cad.block_table_tensor.device
        num_tokens = sum(lengths)
        token_ids, token_pos = torch.cat(ids), torch.cat(positions)
        query_start_cpu = torch.zeros(len(rows) + 1, dtype=torch.int32)
        query_start_cpu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
        seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int32)
        block_table = cad.block_table_tensor[torch.tensor(rows, device=device)]
        owner = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor(lengths)).to(device)
        block_size = drafter.block_size
        slots = block_table[owner, token_pos // block_size].long() * block_size + token_pos % block_size
        meta = CommonAttentionMetadata(
            query_start_loc=query_start_cpu.to(device),
            query_start_loc_cpu=query_start_cpu,
            seq_lens=seq_lens_cpu.to(device),
            num_reqs=len(rows),
            num_actual_tokens=num_tokens,
            max_query_len=max(lengths),
            max_seq_len=max(seq_lens),
            block_table_tensor=block_table,
            slot_mapping=slots,
            causal=True,
            seq_lens_cpu_upper_bound=seq_lens_cpu,
        )
        _, per_layer = drafter.build_per_group_and_layer_attn_metadata(meta)
        drafter.input_ids[:num_tokens] = token_ids
        drafter.positions[:num_tokens] = token_pos
        with set_forward_context(
            per_layer,
            drafter.vllm_config,
            num_tokens=num_tokens,
            cudagraph_runtime_mode=CUDAGraphMode.NONE,
            slot_mapping=drafter._get_slot_mapping(num_tokens, slots),
        ):
            drafter.model(
                input_ids=drafter.input_ids[:num_tokens], positions=drafter.positions[:num_tokens], inputs_embeds=None
            )


def no_drafts(runner: Any, num_reqs: int) -> Any:
    """The skip's proposal: no draft for any of ``num_reqs`` requests. Under async scheduling an empty tensor
    (its runner reads drafts as one); without it a list of empty lists, as vLLM's ngram proposer returns, which
    vLLM copies nowhere and which ``with_quiet_take`` does not report to the scheduler."""
    if runner.use_async_scheduling:
        return torch.empty((num_reqs, 0), dtype=torch.int64, device=runner.device)
    drafts: list[list[int]] = [[] for _ in range(num_reqs)]
    runner.__dict__[_NO_DRAFTS_ATTR] = drafts
    return drafts


def with_quiet_take(original: Original) -> Original:
    """``GPUModelRunner.take_draft_token_ids`` (V1): nothing to report when this step's drafts are the skip's
    ``no_drafts`` list. The report would set each request's ``spec_token_ids`` to ``[]``, which they already
    are: the scheduler empties them for every request it schedules, and the report names only those (the
    input batch keeps no unscheduled request). So the engine's ``post_step`` updates nothing, as it does
    for a runner without speculation."""

    @functools.wraps(original)
    def take_draft_token_ids(self: Any) -> Any:
        drafts = self.__dict__.pop(_NO_DRAFTS_ATTR, None)
        if drafts is not None and drafts is self._draft_token_ids:
            return None
        return original(self)

    return take_draft_token_ids


def needs_rejection_sampler(runner: Any) -> bool:
    """The step's sampling reads what only the rejection sampler gives, even with zero drafts: logprobs (it
    computes them its own way), a thinking budget (its token layout differs in speculative mode), synthetic
    acceptance (it draws random numbers even for greedy requests)."""
    sampling = runner.input_batch.sampling_metadata
    holder = sampling.thinking_budget_state_holder
    return (
        sampling.max_num_logprobs is not None
        or bool(sampling.logprob_token_ids)
        or (holder is not None and holder.has_tracked_requests())
        or getattr(runner.rejection_sampler, "synthetic_mode", False)
    )


def plain_sampler_is_exact(runner: Any, spec_decode_metadata: Any) -> bool:
    """The step has ``SpecDecodeMetadata`` but verifies no draft, and its sampling needs nothing else of the
    rejection sampler."""
    if spec_decode_metadata is None or verifies_drafts(spec_decode_metadata):
        return False
    return not needs_rejection_sampler(runner)


def with_plain_sampler(original: Original) -> Original:
    """``GPUModelRunner._sample`` (V1): a step whose metadata verifies no drafts goes to the plain sampler (the
    steps at k = 0 have no metadata left, ``with_plain_step``; this is for the others: the first at k > 0, a
    prefill)."""
    logged: list[bool] = []

    @functools.wraps(original)
    def _sample(self: Any, logits: Any, spec_decode_metadata: Any) -> Any:
        if plain_sampler_is_exact(self, spec_decode_metadata):
            if not logged:
                logged.append(True)
                log.info("gearshift: idle-drafter skip: a step without drafts sampled by the plain sampler")
            return original(self, logits, None)
        return original(self, logits, spec_decode_metadata)

    return _sample


class _NonSpeculative:
    """What ``_calc_spec_decode_metadata`` gives ``_prepare_inputs`` on a step run without speculation: the one
    field ``_prepare_inputs`` reads, ``logits_indices``, as a runner without speculation computes it."""

    __slots__ = ("logits_indices",)

    def __init__(self, logits_indices: Any) -> None:
        self.logits_indices = logits_indices


def runs_without_speculation(runner: Any, scheduler_output: Any) -> bool:
    """The step schedules no draft at k = 0 and the plugin's skip proposes for it (which reads no metadata), and
    its sampling needs nothing of the rejection sampler: it can run as a step of a runner without speculation."""
    return (
        scheduler_output.num_spec_tokens_to_schedule == 0
        and not scheduler_output.scheduled_spec_decode_tokens
        and skip_for(runner) is not None
        and not needs_rejection_sampler(runner)
    )


def with_plain_step(original: Original) -> Original:
    """``GPUModelRunner._prepare_inputs`` (V1): a step that ``runs_without_speculation`` returns no
    ``SpecDecodeMetadata``, as without a speculative config: the plain sampler samples it, the skip proposes
    nothing, and the metadata (index tensors and copies for zero drafts) is never built."""
    logged: list[bool] = []

    @functools.wraps(original)
    def _prepare_inputs(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        self.__dict__[_PLAIN_STEP_ATTR] = runs_without_speculation(self, scheduler_output)
        try:
            result = original(self, scheduler_output, *args, **kwargs)
        finally:
            self.__dict__[_PLAIN_STEP_ATTR] = False
        if not isinstance(result[1], _NonSpeculative):
            return result
        if not logged:
            logged.append(True)
            log.info("gearshift: idle-drafter skip: a step at k = 0 run without speculative metadata")
        return (result[0], None, *result[2:])

    return _prepare_inputs


def with_plain_step_metadata(original: Original) -> Original:
    """``GPUModelRunner._calc_spec_decode_metadata`` (V1): on a step that ``runs_without_speculation`` and
    verifies no drafts, the logits indices without speculation (``query_start_loc[1:] - 1``) instead."""

    @functools.wraps(original)
    def _calc_spec_decode_metadata(self: Any, num_draft_tokens: Any, cu_num_scheduled_tokens: Any) -> Any:
        if self.__dict__.get(_PLAIN_STEP_ATTR) and not num_draft_tokens.any():
            num_reqs = len(num_draft_tokens)
            return _NonSpeculative(self.query_start_loc.gpu[1 : num_reqs + 1] - 1)
        return original(self, num_draft_tokens, cu_num_scheduled_tokens)

    return _calc_spec_decode_metadata


def verifies_drafts(spec_decode_metadata: Any) -> bool:
    """The step verifies at least one draft token. vLLM 0.32 builds ``SpecDecodeMetadata`` on every step of a
    speculating engine, with ``num_draft_tokens`` all 0 when there are none."""
    return spec_decode_metadata is not None and any(spec_decode_metadata.num_draft_tokens)


def skip_for(runner: Any) -> NgramSkip | DraftModelSkip | None:
    """The skip for ``runner``'s speculative method, built once per runner; None: stock behaviour."""
    if _SKIP_ATTR in runner.__dict__:
        skip: NgramSkip | DraftModelSkip | None = runner.__dict__[_SKIP_ATTR]
        return skip
    spec = runner.speculative_config
    skip = None
    if spec is not None and spec.method == "ngram":
        skip = NgramSkip()
    elif spec is not None and spec.uses_draft_model() and _replayable(runner, spec):
        skip = DraftModelSkip(catch_up=getattr(runner, CATCH_UP_ATTR, True))
    name = type(skip).__name__ if skip else "none (stock)"
    if isinstance(skip, DraftModelSkip) and not skip.catch_up:
        name += " without catch-up (ablation)"
    log.info("gearshift: idle-drafter skip on the V1 runner: %s", name)
    runner.__dict__[_SKIP_ATTR] = skip
    return skip


def _replayable(runner: Any, spec: Any) -> bool:
    """The replay rebuilds the drafter's plain causal prefill: no M-RoPE, no multimodal inputs, padded batches."""
    drafter = runner.drafter
    return not (
        spec.disable_padded_drafter_batch
        or getattr(drafter, "uses_mrope", False)
        or getattr(drafter, "supports_mm_inputs", False)
        or getattr(drafter, "use_heterogeneous_vocab", False)
    )


def with_skip(original: Original) -> Original:
    """``GPUModelRunner.propose_draft_token_ids`` (V1) behind the skip."""

    @functools.wraps(original)
    def propose_draft_token_ids(self: Any, *args: Any) -> Any:
        skip = skip_for(self)
        if skip is None:
            return original(self, *args)
        return skip.propose(original, self, args)

    return propose_draft_token_ids
