"""The performance model of a worker: roofline step time and draft acceptance (DESIGN §4).

The simulator uses it to decide how long each engine step takes and how many drafts are accepted; the
controller uses the same model (corrected online by observed step times) to predict goodput and TPOT for
every candidate k. Parameters live in profile YAML files under ``fleet/profiles/``; the profile documents
which values are physical and which were fitted to the published figures, the hardware it describes and the
vLLM settings it assumes (``serving``), and names the figures file it is calibrated against.

Units: seconds, bytes, FLOPs, tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fleet.config import FleetConfig, load_yaml, parse_model


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
    """Cost per verified (decode) token that the roofline does not see: sampling and draft rejection (logits
    gather, softmax, top-p, accept test) and whatever of the verification kernels does not overlap the weight
    reads, seconds. Not paid by prefill tokens."""
    verify_s_per_token: Annotated[float, Field(ge=0)] = 0.0
    """Extra cost per verified token of a speculative step (k > 0) only, seconds: the verification path's own
    kernels where they are slower than plain decode's (on ROCm vLLM runs the DSpark verify's MLA on
    TRITON_MLA while plain decode keeps AITER MLA; multi-query linear-attention updates). 0: none."""
    state_bytes_per_seq: Annotated[float, Field(ge=0)] = 0.0
    """One copy of a request's constant-size state, bytes, summed over layers and tensor-parallel ranks: the
    recurrent and short-convolution state of linear-attention layers (Kimi Delta Attention), which does not
    grow with context. A decoding sequence reads it once per step and writes it once per verified token (vLLM
    keeps one state slot per draft position to roll back rejected drafts), so a step moves
    ``decode_seqs · (k + 2) · state_bytes_per_seq``; in memory each request holds ``1 + k_max`` copies
    (``state_memory_bytes``). 0: no such layers."""


class IdleDrafterMode(StrEnum):
    """What a worker started with a drafter does on a step where no request verifies a draft (every k = 0)."""

    STOCK = "stock"
    """vLLM's own behaviour: the drafter still runs its pass (``DrafterModel.k0_tax``)."""
    PLUGIN = "plugin"
    """The gearshift plugin skips the drafter's work and keeps its context current (``workers/vllm/idle_v*.py``;
    ``GEARSHIFT_IDLE_DRAFTER=skip`` on the worker, its default): ``DrafterModel.k0_tax_plugin``."""


class IdleDrafterTax(_Strict):
    """Extra time of a k = 0 decode step on a worker started with a drafter (a speculative config), as a fraction
    of the same step's target time on a worker started without one: on a GPU the graphs captured for speculation
    do not fit plain decode, and the drafter's KV cache and buffers stay allocated. Rises linearly with the decode
    batch from ``at_batch_1`` at one sequence to ``at_high_batch`` at ``high_batch`` sequences and beyond."""

    at_batch_1: Annotated[float, Field(ge=0)]
    """Fraction at one decoding sequence (0.065 = +6.5 % step time)."""
    at_high_batch: Annotated[float, Field(ge=0)]
    """Fraction at ``high_batch`` decoding sequences and above."""
    high_batch: Annotated[int, Field(ge=1)]

    def fraction(self, decode_seqs: float) -> float:
        """The tax at ``decode_seqs`` decoding sequences, a fraction of the target time."""
        if self.high_batch <= 1:
            return self.at_high_batch
        x = min(max((decode_seqs - 1) / (self.high_batch - 1), 0.0), 1.0)
        return self.at_batch_1 + x * (self.at_high_batch - self.at_batch_1)


class DrafterModel(_Strict):
    """The block-parallel drafter (DSpark): one forward proposes all k positions."""

    k_max: Annotated[int, Field(ge=1)]
    fixed_s: Annotated[float, Field(ge=0)]
    """Cost of one drafter pass at batch 1, seconds (nearly flat in k)."""
    per_seq_s: Annotated[float, Field(ge=0)]
    """Extra drafter time per sequence in the batch, seconds."""
    per_position_s: Annotated[float, Field(ge=0)]
    """Extra drafter time per draft position per sequence, seconds (small: block-parallel)."""
    weight_bytes: Annotated[float, Field(ge=0)] = 0.0
    """The drafter's weights, bytes (memory only: its per-pass cost is in ``fixed_s``)."""
    k0_tax: IdleDrafterTax | None = None
    """The ``stock`` term: what a k = 0 step costs on a worker started with this drafter under vLLM's own
    behaviour, over one started without it (None: nothing, as on an eager engine)."""
    k0_tax_plugin: IdleDrafterTax | None = None
    """The ``plugin`` term: the same with the gearshift plugin's idle-drafter skip (``IdleDrafterMode.PLUGIN``).
    None: not known for this profile, and a plugin worker is charged the stock term."""

    def idle_tax(self, mode: IdleDrafterMode) -> IdleDrafterTax | None:
        """The k = 0 tax term of a worker in ``mode``."""
        if mode is IdleDrafterMode.PLUGIN and self.k0_tax_plugin is not None:
            return self.k0_tax_plugin
        return self.k0_tax


class Hardware(_Strict):
    gpu: Annotated[str, Field(min_length=1)]
    """The accelerator, as its vendor names it (e.g. ``NVIDIA B300``)."""
    gpus: Annotated[int, Field(ge=1)]
    """Accelerators of one worker (one vLLM engine)."""
    hbm_capacity_bytes_per_gpu: Annotated[float, Field(gt=0)]
    """Memory of one accelerator, bytes."""
    hbm_bytes_per_s: Annotated[float, Field(gt=0)]
    """Effective aggregate memory bandwidth across the worker's GPUs, bytes/s."""
    flops_per_s: Annotated[float, Field(gt=0)]
    """Effective aggregate compute, FLOP/s."""
    kv_capacity_tokens: Annotated[int, Field(gt=0)]
    """KV cache capacity of the worker, tokens: what the memory holds once the weights, the activations and the
    constant state of ``max_num_seqs`` requests are placed (``kv_capacity_from_memory``)."""
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


class ServingSettings(_Strict):
    """The vLLM settings the profile assumes (its recipe); ``deploy/fleets`` files must agree with them."""

    recipe: Annotated[str, Field(min_length=1)]
    """Where the settings come from (recipe file and commit, benchmark PR)."""
    tensor_parallel_size: Annotated[int, Field(ge=1)]
    max_num_seqs: Annotated[int, Field(ge=1, le=4096)]
    """vLLM ``--max-num-seqs``: the most sequences a step batches."""
    max_model_len: Annotated[int, Field(gt=0)]
    """vLLM ``--max-model-len``: the longest prompt + completion, tokens."""
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)]
    """vLLM ``--gpu-memory-utilization``: share of each GPU's memory vLLM may use."""
    kv_cache_dtype: Literal["auto", "fp8"]
    """vLLM ``--kv-cache-dtype`` (``auto``: the model's BF16)."""
    model_runner: Literal["v1", "v2"]
    """vLLM's model runner (``VLLM_USE_V2_MODEL_RUNNER=1`` is v2)."""
    activation_bytes_per_gpu: Annotated[float, Field(ge=0)]
    """Memory each GPU keeps for activations, graphs and communication buffers, bytes."""
    restart_s: Annotated[float, Field(gt=0)] | None = None
    """Seconds from stopping a worker to serving again (weights loaded, graphs captured): what taking it to a
    drafter-free gear and back costs (``controller.drafter_free``). None: not modelled."""


class Profile(_Strict):
    name: str
    description: str = ""
    target: TargetModel
    drafter: DrafterModel
    hardware: Hardware
    serving: ServingSettings
    acceptance: dict[str, AcceptanceClass]
    default_workload: str = "chat"
    chunked_prefill_tokens: Annotated[int, Field(gt=0)] = 8192
    """Token budget per engine step (vLLM's ``max_num_batched_tokens``)."""
    figures: str | None = None
    """Calibration figures: a file name under ``fleet/profiles/calibration/`` or a path (None: none)."""

    @cached_property
    def classes(self) -> tuple[str, ...]:
        return tuple(self.acceptance)

    def with_idle_drafter(self, mode: IdleDrafterMode) -> Profile:
        """This profile as a worker in ``mode`` sees it: its ``k0_tax`` is that mode's term, so every reader of
        ``k0_tax`` (the controller's policy, estimator and cost model, the profiler's fit) charges the mode's tax.
        The lab runs a policy on the plugin's view to show what the skip is worth."""
        term = self.drafter.idle_tax(mode)
        if term is self.drafter.k0_tax:
            return self
        return self.model_copy(update={"drafter": self.drafter.model_copy(update={"k0_tax": term})})

    @model_validator(mode="after")
    def _check_settings(self) -> Self:
        if self.hardware.gpus % self.serving.tensor_parallel_size:
            raise ValueError(
                f"serving.tensor_parallel_size: {self.serving.tensor_parallel_size} does not divide "
                f"hardware.gpus {self.hardware.gpus}"
            )
        if self.default_workload not in self.acceptance:
            raise ValueError(f"default_workload: {self.default_workload!r} is not an acceptance class")
        return self


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
    drafter_loaded: bool = False
    """The worker was started with a drafter: a k = 0 decode step then pays ``DrafterModel.idle_tax`` of its
    ``idle_drafter`` mode. False (the default) is a worker started without speculation, which pays none."""
    idle_drafter: IdleDrafterMode = IdleDrafterMode.STOCK
    """Which idle-drafter tax term a ``drafter_loaded`` worker pays: vLLM's own (stock) or the plugin's."""


@dataclass(frozen=True, slots=True)
class StepTime:
    target_s: float
    """Target model forward (verification of k+1 tokens per decoding sequence, plus prefill)."""
    drafter_s: float
    """What the drafter costs the step: its block-parallel pass when k > 0; at k = 0 on a worker started with
    it, the idle-drafter tax (``DrafterModel.k0_tax``)."""

    @property
    def total_s(self) -> float:
        return self.target_s + self.drafter_s


def experts_touched(profile: Profile, tokens: int) -> float:
    """Expected distinct routed experts per layer touched by ``tokens`` tokens: E·(1 − (1 − r/E)^n)."""
    e, r = profile.target.num_experts, profile.target.experts_per_token
    return e * (1.0 - (1.0 - r / e) ** tokens) if tokens > 0 else 0.0


@dataclass(frozen=True, slots=True)
class _ProfileTerms:
    """What ``step_time`` would compute alike at every call for one profile, by the same expressions (so the same
    floats): seconds of compute per token, the distinct experts by token count as they are asked for, and the
    conditional acceptance by ``(workload, context tokens)`` as it is asked for (``conditional_acceptance``)."""

    compute_s_per_token: float
    touched: dict[int, float]
    acceptance: dict[tuple[str, float], tuple[float, ...]] = field(default_factory=dict)


_TERMS: dict[int, tuple[Profile, _ProfileTerms]] = {}
"""id(profile) → the profile (held, so its id is not reused while cached) and its terms."""
_TERMS_MAX = 256
_TOUCHED_MAX = 65_536
_ACCEPTANCE_MAX = 65_536


def _terms(profile: Profile) -> _ProfileTerms:
    hit = _TERMS.get(id(profile))
    if hit is not None and hit[0] is profile:
        return hit[1]
    t, hw = profile.target, profile.hardware
    routed = min(t.routed_active_params, t.active_params)
    per_token = (t.active_params - routed) / hw.flops_per_s + routed / (hw.moe_flops_per_s or hw.flops_per_s)
    terms = _ProfileTerms(per_token, {})
    if len(_TERMS) >= _TERMS_MAX:
        _TERMS.clear()
    _TERMS[id(profile)] = (profile, terms)
    return terms


def step_time(profile: Profile, shape: StepShape) -> StepTime:
    """Roofline step time, seconds: max(mem, comp) + (1 − overlap) · min(mem, comp) + communication +
    sampling + fixed overhead, plus the drafter's block-parallel pass when k > 0.

    The step processes n = decode_seqs · (k + 1) + prefill_tokens tokens. ``mem`` moves the dense weights,
    the distinct routed experts those n tokens touch (``experts_touched``), the decoding sequences' KV
    (``context_tokens · kv_bytes_per_token · kv_read_replicas``) and their constant state (read once, written
    per verified token: ``decode_seqs · (k + 2) · state_bytes_per_seq``) at ``hbm_bytes_per_s``. ``comp`` is
    2 · active_params FLOPs per token (the routed share at ``moe_flops_per_s``) plus attention: each of the
    decode_seqs · (k + 1) query tokens attends to its sequence's context (``attention_flops_per_context_token``
    · context_tokens · (k + 1)). Communication is ``comm_s_per_token · n``; sampling
    ``sample_s_per_token · decode_seqs · (k + 1)``, plus ``verify_s_per_token · decode_seqs · (k + 1)`` when
    k > 0. At k = 0 with ``drafter_loaded``, the drafter's share is the ``idle_drafter`` mode's tax term
    (``DrafterModel.idle_tax``) ``.fraction(decode_seqs)`` × the target time."""
    return step_time_of(
        profile,
        shape.decode_seqs,
        shape.k,
        shape.context_tokens,
        shape.prefill_tokens,
        shape.drafter_loaded,
        shape.idle_drafter,
    )


def step_time_of(
    profile: Profile,
    decode_seqs: int,
    k: int,
    context_tokens: int,
    prefill_tokens: int = 0,
    drafter_loaded: bool = False,
    idle_drafter: IdleDrafterMode = IdleDrafterMode.STOCK,
) -> StepTime:
    """``step_time`` of the shape with these fields (``StepShape``'s), without building one: the engine and the
    controller's predictions time a step this way at every step and candidate."""
    t, hw = profile.target, profile.hardware
    queries = decode_seqs * (k + 1)
    tokens = queries + prefill_tokens
    if tokens == 0:
        return StepTime(0.0, 0.0)
    terms = _terms(profile)
    touched = terms.touched.get(tokens)
    if touched is None:
        if len(terms.touched) >= _TOUCHED_MAX:
            terms.touched.clear()
        touched = terms.touched[tokens] = experts_touched(profile, tokens)
    weight_bytes = t.dense_bytes + touched * t.expert_bytes
    kv_bytes = context_tokens * t.kv_bytes_per_token * t.kv_read_replicas
    state_bytes = decode_seqs * (k + 2) * t.state_bytes_per_seq
    memory_s = (weight_bytes + kv_bytes + state_bytes) / hw.hbm_bytes_per_s
    compute_s = 2.0 * tokens * terms.compute_s_per_token
    compute_s += t.attention_flops_per_context_token * context_tokens * (k + 1) / hw.flops_per_s
    target = max(memory_s, compute_s) + (1.0 - hw.overlap) * min(memory_s, compute_s)
    target += tokens * t.comm_s_per_token + queries * t.sample_s_per_token + t.step_overhead_s
    if k > 0:
        target += queries * t.verify_s_per_token
    drafter = 0.0
    d = profile.drafter
    if k > 0 and decode_seqs > 0:
        drafter = d.fixed_s + decode_seqs * (d.per_seq_s + k * d.per_position_s)
    elif drafter_loaded and decode_seqs > 0 and (tax := d.idle_tax(idle_drafter)) is not None:
        drafter = target * tax.fraction(decode_seqs)
    return StepTime(target, drafter)


def state_memory_bytes(profile: Profile, seqs: int) -> float:
    """Memory the constant state of ``seqs`` running requests holds, bytes: ``1 + k_max`` slots each (vLLM's
    hybrid cache keeps one per draft position besides the current one)."""
    return seqs * (1 + profile.drafter.k_max) * profile.target.state_bytes_per_seq


def kv_capacity_from_memory(profile: Profile) -> int:
    """KV cache tokens the worker's memory holds, tokens: the usable memory (``gpus · hbm_capacity_bytes_per_gpu
    · gpu_memory_utilization``) less the target's and drafter's weights, the activations and the state of
    ``max_num_seqs`` requests, over the bytes a context token takes on all ranks (``kv_bytes_per_token ·
    kv_read_replicas``). 0 when nothing is left."""
    t, hw, s = profile.target, profile.hardware, profile.serving
    usable = hw.gpus * hw.hbm_capacity_bytes_per_gpu * s.gpu_memory_utilization
    weights = t.dense_bytes + t.num_experts * t.expert_bytes + profile.drafter.weight_bytes
    left = usable - weights - hw.gpus * s.activation_bytes_per_gpu - state_memory_bytes(profile, s.max_num_seqs)
    return max(0, int(left / (t.kv_bytes_per_token * t.kv_read_replicas)))


def conditional_acceptance(profile: Profile, workload: str, context_tokens: float) -> tuple[float, ...]:
    """P(draft i accepted | all earlier accepted) for i = 0 … k_max-1 at this context length (kept per profile:
    the tuned table asks for the same mix at every band and k)."""
    kept = _terms(profile).acceptance
    key = (workload, context_tokens)
    hit = kept.get(key)
    if hit is not None:
        return hit
    cls = profile.acceptance.get(workload) or profile.acceptance[profile.default_workload]
    g = 0.0
    if cls.context_gain > 0:
        g = min(1.0, math.log1p(context_tokens / cls.context_scale) / math.log1p(cls.context_ref / cls.context_scale))
    lift = cls.context_gain * g
    probs = [1.0 - (1.0 - p) * (1.0 - lift) for p in cls.base]
    k_max = profile.drafter.k_max
    probs += [probs[-1]] * (k_max - len(probs))
    out = tuple(probs[:k_max])
    if len(kept) >= _ACCEPTANCE_MAX:
        kept.clear()
    kept[key] = out
    return out


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


def worker_profiles(fleet: FleetConfig) -> dict[str, Profile]:
    """Worker id → its model's profile (``FleetConfig.profile_of``), each profile file loaded once."""
    loaded: dict[str, Profile] = {}
    by_worker = {}
    for w in fleet.workers:
        name = fleet.profile_of(w.id)
        if name not in loaded:
            loaded[name] = load_profile(name)
        by_worker[w.id] = loaded[name]
    return by_worker


def predict_step(
    profile: Profile,
    *,
    batch: float,
    k: int,
    context_per_seq: float,
    prefill_per_step: float = 0.0,
    drafter_loaded: bool = False,
    idle_drafter: IdleDrafterMode = IdleDrafterMode.STOCK,
) -> StepTime:
    """Profiled step time of a step decoding ``batch`` sequences (≥ 1) at draft length ``k``, seconds
    (``drafter_loaded``: on a worker started with a drafter, ``StepShape.drafter_loaded``; ``idle_drafter``: the
    k = 0 tax term it pays, ``StepShape.idle_drafter``)."""
    batch = max(batch, 1.0)
    lo = math.floor(batch)
    hi = lo + 1
    frac = batch - lo
    prefill = round(prefill_per_step)

    def at(b: int) -> StepTime:
        return step_time_of(profile, b, k, round(b * context_per_seq), prefill, drafter_loaded, idle_drafter)

    a = at(lo)
    if frac <= 0:
        return a
    b = at(hi)
    return StepTime(
        target_s=a.target_s + frac * (b.target_s - a.target_s),
        drafter_s=a.drafter_s + frac * (b.drafter_s - a.drafter_s),
    )
