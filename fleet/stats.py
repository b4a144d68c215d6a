"""The one quantile every gearshift report uses, so that "p99" means the same thing in each of them."""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-quantile (0 ≤ q ≤ 1) of ``values``, in their unit, by linear interpolation between closest ranks.

    This is numpy's default method (``"linear"``), Hyndman & Fan's type 7 and ``statistics.quantiles(...,
    method="inclusive")``: with the n values sorted as x₀ ≤ … ≤ xₙ₋₁ and h = (n − 1)·q, the result is
    x⌊h⌋ + (h − ⌊h⌋)·(x⌊h⌋₊₁ − x⌊h⌋). So q = 0 is the minimum, q = 1 the maximum and q = 0.5 the median.
    NaN values (a quantity that does not exist for a sample) are left out; NaN when no value is left.
    Pure Python, so the gateway and the controller need no numpy.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q: {q} is outside 0…1")
    ordered = sorted(v for v in values if not math.isnan(v))
    if not ordered:
        return math.nan
    h = (len(ordered) - 1) * q
    below = math.floor(h)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (h - below) * (ordered[above] - ordered[below])
