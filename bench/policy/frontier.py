"""The throughput–interactivity frontier of a policy: one point per phase of a load sweep, and the
throughput a policy sustains at a given per-user speed (read along its frontier)."""

from __future__ import annotations

import itertools
import math

from bench.policy.suite import SuiteResult

FRONTIER_SCENARIO = "concurrency-sweep"
"""The scenario whose phases (concurrency 1 … 128) trace the frontier."""

MATCHED_SPEEDS: tuple[float, ...] = (50.0, 100.0, 150.0, 200.0, 300.0)
"""Per-user speeds (tokens/s) at which the frontier table reads each policy's throughput."""


def frontier_points(result: SuiteResult, policy: str, scenario: str) -> list[tuple[float, float]]:
    """``(median per-user tok/s, throughput tok/s)`` per phase of ``scenario``, sorted by per-user speed."""
    m = result.runs.get((scenario, policy))
    if m is None:
        return []
    return sorted((p.per_user_tok_s_p50, p.throughput_tok_s) for p in m.phases if not math.isnan(p.per_user_tok_s_p50))


def throughput_at(points: list[tuple[float, float]], speed: float) -> float | None:
    """Throughput on the frontier at per-user ``speed`` (linear between phases; None outside their range).
    Where the frontier is not monotone the best throughput reached at that speed or faster counts."""
    best: float | None = None
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= speed <= x1 and x1 > x0:
            y = y0 + (y1 - y0) * (speed - x0) / (x1 - x0)
            best = y if best is None else max(best, y)
    return best
