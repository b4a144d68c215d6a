"""Where speculation stops paying: the analytic speed-up of draft length k over k = 0 by decode batch size,
and the best draft length at each batch size (the operator's view: which gear a worker should be in).

Pure arithmetic on the profile (no simulation): every sequence of the batch has the same context, the step
is pure decode (no prefill rides along, unlike a ``vllm bench`` run whose prompts are 8× its answers), and a
mix's tokens per step is the harmonic mean of its classes' weighted by output tokens (a closed-loop batch
holds each class in proportion to the time it takes to generate its output).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleet.perf import Profile, StepShape, conditional_acceptance, expected_tokens_per_step, step_time
from workers.sim.arrivals import WorkloadMix

BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BEST_K_BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 256)
BEST_K_CONTEXT_TOKENS = 6000
"""A typical reasoning context (4–8 k tokens) for the best-k table."""


def mix_tokens_per_step(profile: Profile, mix: WorkloadMix, k: int, context_tokens: int) -> float:
    """Mean tokens per sequence per step for ``mix`` at draft length ``k`` (bonus included)."""
    weights = [kind.weight * kind.output_tokens.mean for kind in mix.kinds]
    inverse = sum(
        w / expected_tokens_per_step(conditional_acceptance(profile, kind.workload, context_tokens), k)
        for w, kind in zip(weights, mix.kinds, strict=True)
    )
    return sum(weights) / inverse


def goodput(profile: Profile, mix: WorkloadMix, batch: int, k: int, *, context_tokens: int) -> float:
    """Output tokens/s of a pure-decode batch of ``batch`` sequences at draft length ``k``: B · AL(k) / T(B, k)."""
    shape = StepShape(decode_seqs=batch, k=k, context_tokens=batch * context_tokens)
    return batch * mix_tokens_per_step(profile, mix, k, context_tokens) / step_time(profile, shape).total_s


def speedup(profile: Profile, mix: WorkloadMix, batch: int, k: int, *, context_tokens: int = 2000) -> float:
    """Per-user decode speed at draft length ``k`` over that at k = 0, for ``batch`` sequences."""
    return goodput(profile, mix, batch, k, context_tokens=context_tokens) / goodput(
        profile, mix, batch, 0, context_tokens=context_tokens
    )


def best_k(profile: Profile, mix: WorkloadMix, batch: int, *, context_tokens: int) -> tuple[int, float]:
    """The draft length (0 … k_max) that maximises goodput at ``batch`` and its gain over k = 0."""
    rates = [goodput(profile, mix, batch, k, context_tokens=context_tokens) for k in range(profile.drafter.k_max + 1)]
    k = max(range(len(rates)), key=rates.__getitem__)
    return k, rates[k] / rates[0]


@dataclass(frozen=True)
class CrossoverRow:
    name: str
    tokens_per_step: float
    """Mean tokens per sequence per step at draft length k."""
    speedups: tuple[float, ...]
    """Speed-up over k = 0 at each of ``batches``."""
    batches: tuple[int, ...]

    @property
    def loses_from(self) -> int | None:
        """Smallest batch size from which k loses to k = 0 at every larger listed batch (None: never)."""
        start: int | None = None
        for b, s in zip(self.batches, self.speedups, strict=True):
            start = (b if start is None else start) if s < 1.0 else None
        return start


def crossover_rows(
    profile: Profile,
    mixes: dict[str, WorkloadMix],
    *,
    k: int | None = None,
    context_tokens: int = 2000,
    batches: Sequence[int] = BATCHES,
) -> list[CrossoverRow]:
    """One row per mix: tokens per step at k (default: the drafter's k_max) and the speed-up over k = 0 at
    each batch size."""
    k = profile.drafter.k_max if k is None else k
    return [
        CrossoverRow(
            name,
            mix_tokens_per_step(profile, mix, k, context_tokens),
            tuple(speedup(profile, mix, b, k, context_tokens=context_tokens) for b in batches),
            tuple(batches),
        )
        for name, mix in mixes.items()
    ]


@dataclass(frozen=True)
class BestKRow:
    name: str
    best_k: tuple[int, ...]
    """Goodput-maximising draft length at each of ``batches``."""
    gains: tuple[float, ...]
    """Goodput at the best k over goodput at k = 0, at each of ``batches``."""
    batches: tuple[int, ...]

    @property
    def off_from(self) -> int | None:
        """Smallest batch size from which k = 0 is best at every larger listed batch (None: never)."""
        start: int | None = None
        for b, k in zip(self.batches, self.best_k, strict=True):
            start = (b if start is None else start) if k == 0 else None
        return start


def best_k_rows(
    profile: Profile,
    mixes: dict[str, WorkloadMix],
    *,
    context_tokens: int = BEST_K_CONTEXT_TOKENS,
    batches: Sequence[int] = BEST_K_BATCHES,
) -> list[BestKRow]:
    """One row per mix: the best draft length and its gain over k = 0 at each decode batch size."""
    rows = []
    for name, mix in mixes.items():
        best = [best_k(profile, mix, b, context_tokens=context_tokens) for b in batches]
        rows.append(BestKRow(name, tuple(k for k, _ in best), tuple(g for _, g in best), tuple(batches)))
    return rows
