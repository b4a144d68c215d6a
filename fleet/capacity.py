"""Steady-state throughput of one worker from the shared performance model (``fleet.perf``): pure planning
figures, read by the lab (``bench.policy.capacity``) and by the worker's fallback table (``fleet.fallback``).

Model: a worker decoding ``B`` sequences at draft length ``k`` emits ``B · E[tokens](k)`` tokens per step, and
in steady state also prefills the prompts of the requests that replace finished ones:
``B · E[tokens](k) · prompt / output`` prompt tokens per step. The worker is started with its drafter, so
k = 0 pays the idle-drafter tax (``fleet.perf.IdleDrafterTax``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleet.perf import Profile, StepShape, conditional_acceptance, expected_tokens_per_step, step_time


@dataclass(frozen=True, slots=True)
class MixPoint:
    """Mean request shape of a traffic mix (tokens) and its acceptance, per workload weight."""

    workloads: tuple[tuple[str, float], ...]
    """``(workload, weight)`` pairs; weights need not sum to 1."""
    prompt_tokens: float
    output_tokens: float


def tokens_per_step(profile: Profile, mix: MixPoint, k: int) -> float:
    """Expected tokens emitted per decoding sequence per step at draft length ``k`` for the mix."""
    context = mix.prompt_tokens + mix.output_tokens / 2
    total_w = sum(w for _, w in mix.workloads)
    return sum(
        w * expected_tokens_per_step(conditional_acceptance(profile, name, context), k) for name, w in mix.workloads
    ) / max(total_w, 1e-12)


def throughput(profile: Profile, mix: MixPoint, batch: int, k: int) -> tuple[float, float]:
    """``(output tokens/s, step seconds)`` of one worker decoding ``batch`` sequences at draft length ``k``."""
    per_seq = tokens_per_step(profile, mix, k)
    emitted = batch * per_seq
    prefill = int(emitted * mix.prompt_tokens / max(mix.output_tokens, 1.0))
    context = int(batch * (mix.prompt_tokens + mix.output_tokens / 2))
    t = step_time(profile, StepShape(batch, k, context, prefill, drafter_loaded=True))
    return emitted / t.total_s, t.total_s


def max_batch(profile: Profile, mix: MixPoint, max_num_seqs: int) -> int:
    """The largest batch the KV cache holds for this mix (at least 1)."""
    per_seq = mix.prompt_tokens + mix.output_tokens
    return max(1, min(max_num_seqs, int(profile.hardware.kv_capacity_tokens // per_seq)))


def best_k(profile: Profile, mix: MixPoint, batch: int, ks: Sequence[int] | None = None) -> int:
    """The static k with the highest throughput at this batch size."""
    ks = ks if ks is not None else range(profile.drafter.k_max + 1)
    return max(ks, key=lambda k: throughput(profile, mix, batch, k)[0])
