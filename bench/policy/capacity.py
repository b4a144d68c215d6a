"""Steady-state estimates from the shared performance model (``fleet.perf``), used to size scenarios.

The model itself (``MixPoint``, ``throughput``, ``best_k``, ``max_batch``) lives in ``fleet.capacity``, so the
worker's fallback table uses it without importing the lab. These are planning figures, not results: the lab's
results come from running the engine. They let a scenario say "Poisson at 0.6 × capacity" and keep its meaning
when the profile is recalibrated.

Model: a worker decoding ``B`` sequences at draft length ``k`` emits ``B · E[tokens](k)`` tokens per step, and
in steady state also prefills the prompts of the requests that replace finished ones:
``B · E[tokens](k) · prompt / output`` prompt tokens per step. The workers are the lab's, started with their
drafter, so k = 0 pays the idle-drafter tax (``fleet.perf.IdleDrafterTax``).
"""

from __future__ import annotations

from fleet.capacity import MixPoint, best_k, max_batch, throughput, tokens_per_step
from fleet.perf import Profile

__all__ = [
    "MixPoint",
    "best_k",
    "break_even_batch",
    "capacity_requests_per_s",
    "max_batch",
    "throughput",
    "tokens_per_step",
]


def capacity_requests_per_s(profile: Profile, mix: MixPoint, *, workers: int, max_num_seqs: int) -> float:
    """Fleet capacity in requests/s: the best static k at the largest batch the KV cache allows."""
    batch = max_batch(profile, mix, max_num_seqs)
    tok_s = max(throughput(profile, mix, batch, k)[0] for k in range(profile.drafter.k_max + 1))
    return workers * tok_s / mix.output_tokens


def break_even_batch(profile: Profile, mix: MixPoint, max_num_seqs: int) -> int | None:
    """The smallest batch size at which k = 0 out-earns every k > 0, or None if speculation always pays."""
    for batch in range(1, max_batch(profile, mix, max_num_seqs) + 1):
        if best_k(profile, mix, batch) == 0:
            return batch
    return None
