"""Workload classes in a worker's traffic, inferred from the shape of its per-position acceptance.

vLLM's counters are per worker, not per request class, so a worker serving chat and maths reports one blended
acceptance; a TPOT predicted from it is the mean over the classes, and the class with the lower acceptance (chat)
runs slower than predicted — at a high k much slower, since its drafts are mostly rejected while every step pays
for verifying them. The classes differ in how acceptance decays with the draft position, so the observed
unconditional acceptance per position ``a_i`` is fitted as a mix of (at most two of) the profile's acceptance
classes: ``a_i ≈ w·a_i(c1) + (1 − w)·a_i(c2)``, weighted by the drafts behind each position, ``w`` on a grid.
``w`` is the share of request-steps (not of requests) of ``c1``. Units: probabilities and shares, 0…1.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence

from fleet.perf import Profile, conditional_acceptance, expected_tokens_per_step

_GRID = 20
"""Steps of the mixing weight's grid (0, 1/20, … , 1)."""


def unconditional(conditional: Sequence[float]) -> list[float]:
    """``a_i = Π_{j≤i} p_j``: P(draft i accepted) from the conditionals."""
    return list(itertools.accumulate(conditional, operator.mul))


def _error_floor(rows: Sequence[tuple[float, float, float, float]]) -> float:
    """A lower bound on the fit's error at every weight for one pair of classes, ``rows`` = ``(a_i, drafts_i,
    p1_i, p2_i)``: a mix ``w·p1 + (1 − w)·p2`` lies between ``p1`` and ``p2``, so each position costs at least its
    drafts × the squared distance from ``a_i`` to that interval. Shrunk (by 1e-15 per distance and 1e-9 of the
    total) below what the grid's errors can round to, so a pair skipped by it could never have been chosen."""
    total = 0.0
    for a, d, p1, p2 in rows:
        gap = max(min(p1, p2) - a, a - max(p1, p2)) - 1e-15
        if gap > 0:
            total += d * gap * gap
    return (1 - 1e-9) * total


def fit_mix(
    profile: Profile, observed: Sequence[tuple[float, float]], context_tokens: float
) -> tuple[tuple[str, float], ...]:
    """Best mix of at most two profile classes for ``observed`` = leading positions' ``(a_i, drafts_i)``.

    Returns ``((class, share), …)`` with shares summing to 1, largest share first; empty when nothing is observed.
    """
    if not observed:
        return ()
    priors = {c: unconditional(conditional_acceptance(profile, c, context_tokens)) for c in profile.acceptance}
    best: tuple[float, tuple[tuple[str, float], ...]] | None = None
    for c1, c2 in itertools.combinations_with_replacement(sorted(priors), 2):
        rows = [(a, d, p1, p2) for (a, d), p1, p2 in zip(observed, priors[c1], priors[c2], strict=False)]
        if best is not None and _error_floor(rows) >= best[0]:
            continue  # no weight can beat the best so far: the grid's errors are all at least the floor
        for step in range(_GRID + 1):
            w = step / _GRID
            v = 1 - w
            err = sum([d * (a - (w * p1 + v * p2)) ** 2 for a, d, p1, p2 in rows])
            if best is None or err < best[0] - 1e-12:
                mix = ((c1, 1.0),) if c1 == c2 else ((c1, w), (c2, 1 - w))
                best = (err, mix)
    assert best is not None
    merged = {c: s for c, s in best[1] if s > 0}
    return tuple(sorted(merged.items(), key=lambda cs: -cs[1]))


def slowest_al_ratio(
    profile: Profile, mix: Sequence[tuple[str, float]], k: int, context_tokens: float, *, min_share: float
) -> float:
    """AL(k) of the class with the lowest acceptance that holds at least ``min_share`` of the mix, over the mix's
    AL(k): multiply a blended accepted length by it to get that class's (1.0 with a single class)."""
    present = [(c, s) for c, s in mix if s >= min_share]
    if len(present) < 2:
        return 1.0
    al = {c: expected_tokens_per_step(conditional_acceptance(profile, c, context_tokens), k) for c, _ in mix}
    blended = sum(s * al[c] for c, s in mix)
    return min(al[c] for c, _ in present) / blended if blended > 0 else 1.0
