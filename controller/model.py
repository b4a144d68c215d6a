"""Predictions from the shared performance model (``fleet.perf``) at fractional mean batch sizes.

The estimator measures a *mean* decode batch (for example 11.4 sequences); the profile's roofline takes whole
sequences, so predictions interpolate linearly between the two neighbouring integers. Units: seconds, tokens.
"""

from __future__ import annotations

import math

from fleet.perf import Profile, StepShape, StepTime, step_time


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
