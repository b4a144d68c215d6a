"""The performance model of a worker: roofline step time and draft acceptance (DESIGN §4).

The simulator uses it to decide how long each engine step takes and how many drafts are accepted; the
controller uses the same model (corrected online by observed step times) to predict goodput and TPOT for
every candidate k. Parameters live in profile YAML files under ``fleet/profiles/``; the profile documents
which values are physical and which were fitted to the published figures.

Units: seconds, bytes, FLOPs, tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from fleet.config import load_yaml, parse_model


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TargetModel(_Strict):
    """The verified (target) model's cost structure."""

    dense_bytes: Annotated[float, Field(gt=0)]
    """Weights read every step whatever the batch: attention, shared experts, embeddings (bytes)."""
    num_experts: Annotated[int, Field(gt=0)]
    experts_per_token: Annotated[int, Field(gt=0)]
    expert_bytes: Annotated[float, Field(gt=0)]
    """Bytes of one routed expert summed over all MoE layers."""
    active_params: Annotated[float, Field(gt=0)]
    """Parameters touched per token (for FLOPs = 2 · active_params per token)."""
    kv_bytes_per_token: Annotated[float, Field(gt=0)]
    """KV cache bytes per context token summed over layers (MLA latent cache)."""
    kv_read_replicas: Annotated[float, Field(ge=1)] = 1.0
    """How many GPUs each read a sequence's whole KV cache per step. MLA under tensor parallelism keeps the
    latent cache replicated on every rank (unless decode-context parallelism shards it), so every rank reads
    all of it: the aggregate bytes moved are ``context · kv_bytes_per_token · kv_read_replicas``."""
    comm_s_per_token: Annotated[float, Field(ge=0)]
    """Inter-GPU communication time per token in the step (tensor-parallel all-reduces), seconds."""
    step_overhead_s: Annotated[float, Field(ge=0)]
    """Fixed per-step cost: kernel launches, scheduling, latency of the collectives, seconds."""
    routed_active_params: Annotated[float, Field(ge=0)] = 0.0
    """The part of ``active_params`` computed by the routed experts' grouped (INT4) GEMMs, which run at
    ``Hardware.moe_flops_per_s``; the rest runs at ``flops_per_s``. 0: all at ``flops_per_s``."""
    attention_flops_per_context_token: Annotated[float, Field(ge=0)] = 0.0
    """Attention FLOPs per query token per context token, summed over layers (MLA absorbed attention:
    layers · heads · (2·(latent + rope) + 2·latent)). 0: attention FLOPs left out (memory-bound decode)."""
    sample_s_per_token: Annotated[float, Field(ge=0)] = 0.0
    """Sampling and draft rejection per verified (decode) token: logits gather, softmax, top-p, accept test,
    seconds. Not paid by prefill tokens."""


class DrafterModel(_Strict):
    """The block-parallel drafter (DSpark): one forward proposes all k positions."""

    k_max: Annotated[int, Field(ge=1)]
    fixed_s: Annotated[float, Field(ge=0)]
    """Cost of one drafter pass at batch 1, seconds (nearly flat in k)."""
    per_seq_s: Annotated[float, Field(ge=0)]
    """Extra drafter time per sequence in the batch, seconds."""
    per_position_s: Annotated[float, Field(ge=0)]
    """Extra drafter time per draft position per sequence, seconds (small: block-parallel)."""


class Hardware(_Strict):
    hbm_bytes_per_s: Annotated[float, Field(gt=0)]
    """Effective aggregate memory bandwidth across the worker's GPUs, bytes/s."""
    flops_per_s: Annotated[float, Field(gt=0)]
    """Effective aggregate compute, FLOP/s."""
    kv_capacity_tokens: Annotated[int, Field(gt=0)]
    """KV cache capacity of the worker, tokens."""
    moe_flops_per_s: Annotated[float, Field(gt=0)] | None = None
    """Effective compute of the routed experts' grouped GEMMs, FLOP/s (None: ``flops_per_s``)."""
    overlap: Annotated[float, Field(ge=0, le=1)] = 1.0
    """How much of the shorter of memory and compute time hides under the longer: the roofline is
    ``max(mem, comp) + (1 − overlap) · min(mem, comp)`` (1: the ideal max; 0: kernels serialise them)."""


class AcceptanceClass(_Strict):
    """Conditional per-position acceptance for one workload class.

    ``base[i]`` is P(draft i accepted | drafts 0…i-1 accepted) at short context; acceptance rises with
    context towards ``ceiling`` as ``1 - (1 - p) · (1 - context_gain · g(ctx))`` with
    ``g(ctx) = log1p(ctx / context_scale) / log1p(context_ref / context_scale)`` capped at 1.
    """

    base: Annotated[tuple[Annotated[float, Field(ge=0, le=1)], ...], Field(min_length=1)]
    """Probabilities in [0, 1]; positions past the end repeat the last value."""
    context_gain: Annotated[float, Field(ge=0, le=1)] = 0.0
    context_scale: Annotated[float, Field(gt=0)] = 4096.0
    context_ref: Annotated[float, Field(gt=0)] = 400_000.0


class Profile(_Strict):
    name: str
    description: str = ""
    target: TargetModel
    drafter: DrafterModel
    hardware: Hardware
    acceptance: dict[str, AcceptanceClass]
    default_workload: str = "chat"
    chunked_prefill_tokens: Annotated[int, Field(gt=0)] = 8192
    """Token budget per engine step (vLLM's ``max_num_batched_tokens``)."""

    @cached_property
    def classes(self) -> tuple[str, ...]:
        return tuple(self.acceptance)


@dataclass(frozen=True, slots=True)
class StepShape:
    """What one engine step processes."""

    decode_seqs: int
    """Sequences decoding this step."""
    k: int
    """Draft tokens per decoding sequence (0 = no speculation)."""
    context_tokens: int
    """Sum of the decoding sequences' context lengths, tokens (drives KV reads)."""
    prefill_tokens: int = 0
    """Prompt tokens prefilled in this step (chunked prefill)."""


@dataclass(frozen=True, slots=True)
class StepTime:
    target_s: float
    """Target model forward (verification of k+1 tokens per decoding sequence, plus prefill)."""
    drafter_s: float

    @property
    def total_s(self) -> float:
        return self.target_s + self.drafter_s


def experts_touched(profile: Profile, tokens: int) -> float:
    """Expected distinct routed experts per layer touched by ``tokens`` tokens: E·(1 − (1 − r/E)^n)."""
    e, r = profile.target.num_experts, profile.target.experts_per_token
    return e * (1.0 - (1.0 - r / e) ** tokens) if tokens > 0 else 0.0


def step_time(profile: Profile, shape: StepShape) -> StepTime:
    """Roofline step time, seconds: max(mem, comp) + (1 − overlap) · min(mem, comp) + communication +
    sampling + fixed overhead, plus the drafter's block-parallel pass when k > 0.

    The step processes n = decode_seqs · (k + 1) + prefill_tokens tokens. ``mem`` moves the dense weights,
    the distinct routed experts those n tokens touch (``experts_touched``) and the decoding sequences' KV
    (``context_tokens · kv_bytes_per_token · kv_read_replicas``) at ``hbm_bytes_per_s``. ``comp`` is
    2 · active_params FLOPs per token (the routed share at ``moe_flops_per_s``) plus attention: each of the
    decode_seqs · (k + 1) query tokens attends to its sequence's context (``attention_flops_per_context_token``
    · context_tokens · (k + 1)). Communication is ``comm_s_per_token · n``; sampling
    ``sample_s_per_token · decode_seqs · (k + 1)``."""
    t, hw = profile.target, profile.hardware
    queries = shape.decode_seqs * (shape.k + 1)
    tokens = queries + shape.prefill_tokens
    if tokens == 0:
        return StepTime(0.0, 0.0)
    weight_bytes = t.dense_bytes + experts_touched(profile, tokens) * t.expert_bytes
    kv_bytes = shape.context_tokens * t.kv_bytes_per_token * t.kv_read_replicas
    memory_s = (weight_bytes + kv_bytes) / hw.hbm_bytes_per_s
    routed = min(t.routed_active_params, t.active_params)
    compute_s = (
        2.0 * tokens * ((t.active_params - routed) / hw.flops_per_s + routed / (hw.moe_flops_per_s or hw.flops_per_s))
    )
    compute_s += t.attention_flops_per_context_token * shape.context_tokens * (shape.k + 1) / hw.flops_per_s
    target = max(memory_s, compute_s) + (1.0 - hw.overlap) * min(memory_s, compute_s)
    target += tokens * t.comm_s_per_token + queries * t.sample_s_per_token + t.step_overhead_s
    drafter = 0.0
    if shape.k > 0 and shape.decode_seqs > 0:
        d = profile.drafter
        drafter = d.fixed_s + shape.decode_seqs * (d.per_seq_s + shape.k * d.per_position_s)
    return StepTime(target, drafter)


def conditional_acceptance(profile: Profile, workload: str, context_tokens: float) -> tuple[float, ...]:
    """P(draft i accepted | all earlier accepted) for i = 0 … k_max-1 at this context length."""
    cls = profile.acceptance.get(workload) or profile.acceptance[profile.default_workload]
    g = 0.0
    if cls.context_gain > 0:
        g = min(1.0, math.log1p(context_tokens / cls.context_scale) / math.log1p(cls.context_ref / cls.context_scale))
    lift = cls.context_gain * g
    probs = [1.0 - (1.0 - p) * (1.0 - lift) for p in cls.base]
    k_max = profile.drafter.k_max
    probs += [probs[-1]] * (k_max - len(probs))
    return tuple(probs[:k_max])


def expected_tokens_per_step(conditional: tuple[float, ...] | list[float], k: int) -> float:
    """Mean tokens emitted per sequence per step at draft length k: 1 + Σ_{i<k} Π_{j≤i} p_j (bonus included)."""
    total, survive = 1.0, 1.0
    for p in conditional[:k]:
        survive *= p
        total += survive
    return total


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a profile by name (``fleet/profiles/<name>.yaml``) or from a path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = Path(str(resources.files("fleet.profiles").joinpath(f"{name_or_path}.yaml")))
    return parse_model(Profile, load_yaml(path), source=str(path))


def predict_step(
    profile: Profile, *, batch: float, k: int, context_per_seq: float, prefill_per_step: float = 0.0
) -> StepTime:
    """Profiled step time of a step decoding ``batch`` sequences (≥ 1) at draft length ``k``, seconds."""
    batch = max(batch, 1.0)
    lo = math.floor(batch)
    hi = lo + 1
    frac = batch - lo
    prefill = round(prefill_per_step)

    def at(b: int) -> StepTime:
        return step_time(profile, StepShape(b, k, round(b * context_per_seq), prefill))

    a = at(lo)
    if frac <= 0:
        return a
    b = at(hi)
    return StepTime(
        target_s=a.target_s + frac * (b.target_s - a.target_s),
        drafter_s=a.drafter_s + frac * (b.drafter_s - a.drafter_s),
    )
