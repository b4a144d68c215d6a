"""Run with ``.venv-vllm``'s python: the idle-drafter skip's per-step shortcuts on vLLM 0.32's V1 runner, with
vLLM's own classes (no engine). Prints one JSON object.

- ``sampler``: a step's zero-draft ``SpecDecodeMetadata`` built by vLLM's own ``_calc_spec_decode_metadata``;
  vLLM's ``RejectionSampler`` on it against vLLM's plain ``Sampler`` with no metadata, greedy and seeded random:
  the sampled tokens and the per-request generators' states after sampling;
- ``routing``: ``idle_v1.with_plain_sampler`` around vLLM's own ``GPUModelRunner._sample`` on a stand-in runner
  whose samplers are vLLM's, counted: which one a step goes to;
- ``plain_step``: ``idle_v1.with_plain_step`` and ``with_plain_step_metadata`` around a stand-in for
  ``_prepare_inputs`` that calls vLLM's own ``_calc_spec_decode_metadata`` as ``_prepare_inputs`` does (what it
  calls and reads is checked on vLLM's source in test_idle_v1.py): which steps lose their metadata;
- ``take``: ``idle_v1.with_quiet_take`` around vLLM's own ``GPUModelRunner.take_draft_token_ids``: what it
  reports after the skip's empty proposal and after a real one;
- ``skip``: ``DraftModelSkip`` at k = 0 on a stand-in runner, with and without async scheduling's
  ``valid_sampled_token_count_event``: whether the next-token bookkeeping ran.
"""

from __future__ import annotations

import functools
import json
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from workers.vllm import idle_v1

VOCAB = 64
SEEDS = (11, 22, 33)


def sampling_metadata(*, greedy: bool, logprobs: int | None = None) -> Any:
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    n = len(SEEDS)
    return SamplingMetadata(
        temperature=None if greedy else torch.full((n,), 0.8),
        all_greedy=greedy,
        all_random=not greedy,
        top_p=None,
        top_k=None,
        generators={} if greedy else {i: torch.Generator().manual_seed(s) for i, s in enumerate(SEEDS)},
        max_num_logprobs=logprobs,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(n),
        presence_penalties=torch.zeros(n),
        repetition_penalties=torch.ones(n),
        output_token_ids=[[] for _ in range(n)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
        spec_token_ids=[[] for _ in range(n)],
    )


def zero_draft_metadata(num_scheduled: list[int]) -> Any:
    """What vLLM's ``_calc_spec_decode_metadata`` builds for a step with no drafts (its own code, on a stand-in)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    stub = SimpleNamespace(arange_np=np.arange(256), _arange_scratch=np.zeros(256, dtype=np.int64))
    stub._get_cumsum_and_arange = functools.partial(GPUModelRunner._get_cumsum_and_arange, stub)
    stub.device = torch.device("cpu")
    stub.input_ids = SimpleNamespace(gpu=torch.arange(256, dtype=torch.int32))
    cu = np.cumsum(np.array(num_scheduled, dtype=np.int32))
    return GPUModelRunner._calc_spec_decode_metadata(stub, np.zeros(len(num_scheduled), dtype=np.int32), cu)


def samplers() -> tuple[Any, Any]:
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    plain = Sampler()
    return plain, RejectionSampler(plain)


def sampler() -> dict[str, Any]:
    plain, rejection = samplers()
    meta = zero_draft_metadata([3, 1, 1])  # a prefill chunk of 3 and two decodes
    logits = torch.randn(len(SEEDS), VOCAB, generator=torch.Generator().manual_seed(0))
    result: dict[str, Any] = {"logits_indices": meta.logits_indices.tolist(), "max_spec_len": meta.max_spec_len}
    for mode in ("greedy", "random"):
        a, b = sampling_metadata(greedy=mode == "greedy"), sampling_metadata(greedy=mode == "greedy")
        out_plain = plain(logits=logits.clone(), sampling_metadata=a).sampled_token_ids
        out_rejection = rejection(meta, None, logits.clone(), b).sampled_token_ids
        result[mode] = {
            "plain": out_plain.tolist(),
            "rejection": out_rejection.tolist(),
            "generators_equal": all(
                torch.equal(a.generators[i].get_state(), b.generators[i].get_state()) for i in a.generators
            ),
        }
    return result


class Counted:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0
        self.synthetic_mode = getattr(inner, "synthetic_mode", False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.inner(*args, **kwargs)


def routing() -> dict[str, Any]:
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    wrapped = idle_v1.with_plain_sampler(GPUModelRunner._sample)
    logits = torch.randn(len(SEEDS), VOCAB, generator=torch.Generator().manual_seed(1))
    result: dict[str, Any] = {}
    cases: dict[str, tuple[Any, Any]] = {
        "no_drafts": (zero_draft_metadata([1, 1, 1]), sampling_metadata(greedy=True)),
        "drafts": (
            SpecDecodeMetadata.make_dummy([[5, 6], [], [7]], torch.device("cpu")),
            sampling_metadata(greedy=True),
        ),
        "no_drafts_logprobs": (zero_draft_metadata([1, 1, 1]), sampling_metadata(greedy=True, logprobs=1)),
        "no_metadata": (None, sampling_metadata(greedy=True)),
    }
    for name, (meta, sm) in cases.items():
        plain, rejection = samplers()
        runner = SimpleNamespace(
            sampler=Counted(plain),
            rejection_sampler=Counted(rejection),
            input_batch=SimpleNamespace(
                sampling_metadata=sm, update_async_output_token_ids=lambda: None, req_ids=["a", "b", "c"]
            ),
            use_async_scheduling=False,
            _draft_token_req_ids=None,
            _draft_probs=None,
            _draft_prob_req_ids=None,
        )
        runner._get_spec_decode_draft_probs = functools.partial(GPUModelRunner._get_spec_decode_draft_probs, runner)
        rows = logits if meta is None or not meta.max_spec_len else torch.randn(6, VOCAB)
        try:
            wrapped(runner, rows, meta)
            error = None
        except Exception as exc:  # the dummy metadata's indices are not a real step's: only the routing counts
            error = type(exc).__name__
        result[name] = {"plain": runner.sampler.calls, "rejection": runner.rejection_sampler.calls, "error": error}
    return result


def plain_step() -> dict[str, Any]:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    num_scheduled = np.array([3, 1, 1], dtype=np.int32)

    def prepare_inputs(self: Any, scheduler_output: Any, num_scheduled_tokens: np.ndarray) -> Any:
        num_draft_tokens = np.zeros(len(num_scheduled_tokens), dtype=np.int32)
        for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
            num_draft_tokens[int(req_id)] = len(drafts)
        spec_decode_metadata = self._calc_spec_decode_metadata(num_draft_tokens, np.cumsum(num_scheduled_tokens))
        return spec_decode_metadata.logits_indices, spec_decode_metadata, 1

    prepare = idle_v1.with_plain_step(prepare_inputs)
    calc = idle_v1.with_plain_step_metadata(GPUModelRunner._calc_spec_decode_metadata)
    cases = {
        "k0": (0, {}, None),
        "k0_logprobs": (0, {}, 1),
        "k0_verifying_the_last_drafts": (0, {"1": [5, 6]}, None),
        "k2": (2, {}, None),
    }
    result: dict[str, Any] = {}
    for name, (k, drafts, logprobs) in cases.items():
        query_start = np.concatenate([[0], np.cumsum(num_scheduled)])
        runner = SimpleNamespace(
            arange_np=np.arange(256),
            _arange_scratch=np.zeros(256, dtype=np.int64),
            device=torch.device("cpu"),
            input_ids=SimpleNamespace(gpu=torch.arange(256, dtype=torch.int32)),
            query_start_loc=SimpleNamespace(gpu=torch.tensor([*query_start, query_start[-1]], dtype=torch.int32)),
            input_batch=SimpleNamespace(sampling_metadata=sampling_metadata(greedy=True, logprobs=logprobs)),
            rejection_sampler=SimpleNamespace(synthetic_mode=False),
            speculative_config=SimpleNamespace(method="ngram"),
        )
        runner._get_cumsum_and_arange = functools.partial(GPUModelRunner._get_cumsum_and_arange, runner)
        runner._calc_spec_decode_metadata = functools.partial(calc, runner)
        scheduler_output = SimpleNamespace(num_spec_tokens_to_schedule=k, scheduled_spec_decode_tokens=drafts)
        logits_indices, meta, _ = prepare(runner, scheduler_output, num_scheduled)
        result[name] = {
            "metadata": None if meta is None else type(meta).__name__,
            "num_draft_tokens": None if meta is None else meta.num_draft_tokens,
            "logits_indices": logits_indices.tolist(),
            "flag_left_set": bool(vars(runner).get("_gearshift_plain_step")),
        }
    return result


def take() -> dict[str, Any]:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    take = idle_v1.with_quiet_take(GPUModelRunner.take_draft_token_ids)
    result: dict[str, Any] = {}
    for name in ("skip", "drafts", "skip_then_drafts"):
        runner = SimpleNamespace(
            use_async_scheduling=False, num_spec_tokens=4, input_batch=SimpleNamespace(req_ids=["a", "b"])
        )
        runner._draft_token_req_ids = ["a", "b"]
        runner._get_draft_token_ids_cpu = functools.partial(GPUModelRunner._get_draft_token_ids_cpu, runner)
        if name != "drafts":
            runner._draft_token_ids = idle_v1.no_drafts(runner, 2)
        if name != "skip":
            runner._draft_token_ids = [
                [5, 6],
                [7],
            ]  # a later proposal in the same step never happens; a stale mark must not hide it
        reported = take(runner)
        result[name] = None if reported is None else {"req_ids": reported.req_ids, "drafts": reported.draft_token_ids}
    return result


def skip() -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, event in (("sync", None), ("async", object())):
        calls: list[str] = []

        def prepare(*args: Any, calls: list[str] = calls) -> tuple[torch.Tensor, torch.Tensor]:
            calls.append("prepare_next_token_ids_padded")
            return torch.zeros(2, dtype=torch.int32), torch.ones(2, dtype=torch.int32)

        def copy_counts(*args: Any, calls: list[str] = calls) -> None:
            calls.append("_copy_valid_sampled_token_count")

        runner = SimpleNamespace(
            input_batch=SimpleNamespace(
                num_reqs=2, req_ids=["a", "b"], num_computed_tokens_cpu=np.array([5, 7], dtype=np.int32)
            ),
            drafter=SimpleNamespace(prepare_next_token_ids_padded=prepare),
            requests={},
            discard_request_mask=SimpleNamespace(gpu=torch.zeros(2, dtype=torch.bool)),
            valid_sampled_token_count_event=event,
            use_async_scheduling=event is not None,
            _copy_valid_sampled_token_count=copy_counts,
            query_start_loc=SimpleNamespace(np=np.array([0, 1, 2], dtype=np.int32)),
            input_ids=SimpleNamespace(gpu=torch.arange(8)),
            _get_positions=lambda n: torch.arange(n),
            device=torch.device("cpu"),
        )
        scheduler_output = SimpleNamespace(num_spec_tokens_to_schedule=0, total_num_scheduled_tokens=2)
        drafts = idle_v1.DraftModelSkip()._skip(runner, scheduler_output, torch.zeros(2, 1, dtype=torch.int32))
        result[name] = {
            "calls": calls,
            "drafts": drafts if isinstance(drafts, list) else f"tensor{list(drafts.shape)}",
            "marked": vars(runner).get("_gearshift_no_drafts") is drafts,
        }
    return result


if __name__ == "__main__":
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()  # the CPU kernels, as the CPU worker registers them
    answer = {"sampler": sampler(), "routing": routing(), "plain_step": plain_step(), "take": take(), "skip": skip()}
    sys.stdout.write(json.dumps(answer) + "\n")
