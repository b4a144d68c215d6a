"""Where speculation stops paying: the analytic speed-up of draft length k over k = 0 by decode batch size.

Pure arithmetic on the profile (no simulation): every sequence of the batch has the same context, the step
is pure decode, and a mix's tokens per step is the harmonic mean of its classes' weighted by output tokens
(a closed-loop batch holds each class in proportion to the time it takes to generate its output).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleet.perf import Profile, StepShape, conditional_acceptance, expected_tokens_per_step, step_time
from workers.sim.arrivals import WorkloadMix

BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def mix_tokens_per_step(profile: Profile, mix: WorkloadMix, k: int, context_tokens: int) -> float:
    """Mean tokens per sequence per step for ``mix`` at draft length ``k`` (bonus included)."""
    weights = [kind.weight * kind.output_tokens.mean for kind in mix.kinds]
    inverse = sum(
        w / expected_tokens_per_step(conditional_acceptance(profile, kind.workload, context_tokens), k)
        for w, kind in zip(weights, mix.kinds, strict=True)
    )
    return sum(weights) / inverse


def speedup(profile: Profile, mix: WorkloadMix, batch: int, k: int, *, context_tokens: int = 2000) -> float:
    """Per-user decode speed at draft length ``k`` over that at k = 0, for ``batch`` sequences."""

    def rate(kk: int) -> float:
        shape = StepShape(decode_seqs=batch, k=kk, context_tokens=batch * context_tokens)
        return mix_tokens_per_step(profile, mix, kk, context_tokens) / step_time(profile, shape).total_s

    return rate(k) / rate(0)


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
    k: int = 8,
    context_tokens: int = 2000,
    batches: Sequence[int] = BATCHES,
) -> list[CrossoverRow]:
    """One row per mix: tokens per step at k and the speed-up over k = 0 at each batch size."""
    return [
        CrossoverRow(
            name,
            mix_tokens_per_step(profile, mix, k, context_tokens),
            tuple(speedup(profile, mix, b, k, context_tokens=context_tokens) for b in batches),
            tuple(batches),
        )
        for name, mix in mixes.items()
    ]
