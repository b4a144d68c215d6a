"""How exact a measured figure of the replay check is, from its number of samples (issue 29).

A p99 of 200 latencies is the second-largest of them: another run of the same length would give a quite different
one. Each measured figure therefore carries a confidence interval (``LEVEL``, two-sided, equal tails), and a
prediction outside the tolerance is a miss only when it is outside the tolerance of every value in that interval.

- A quantile (TTFT, TPOT p50 / p99): the distribution-free interval between two order statistics, whose ranks
  come from the binomial law of how many samples fall below the true quantile (Conover, *Practical
  Nonparametric Statistics*, §3.2). It needs no assumption on the latencies' distribution; with too few samples a
  side has no order statistic to stand on and is unbounded (a p99's upper side below ~370 samples at 95 %).
- A throughput (output tokens finished in the window per second): arrivals are a Poisson stream, so the tokens
  finished are a compound Poisson sum S, whose variance is estimated by the sum of the squared per-request tokens;
  the interval is S ± z·√Σx², over the window (a normal approximation, fine from a few tens of requests).

The interval is the measured figure's sampling noise. The replay replays the same requests, so part of that
noise is shared by the prediction: the interval is a conservative bound on what the comparison can resolve.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

LEVEL = 0.95
Verdict = Literal["within", "within its CI", "miss"]


@dataclass(frozen=True)
class Interval:
    """A confidence interval [lo, hi], in the figure's unit; ``hi`` is ``math.inf`` when unbounded above."""

    lo: float
    hi: float


def binomial_cdfs(n: int, p: float) -> list[float]:
    """P(B ≤ k) for k = 0 … n, B ~ Binomial(n, p): the probabilities summed in log space, exact to float
    rounding for any n."""
    if p <= 0.0 or p >= 1.0:
        return [1.0 if p <= 0.0 or k == n else 0.0 for k in range(n + 1)]
    log_p, log_q, log_n = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    logs = [log_n - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q for i in range(n + 1)]
    top = max(logs)
    weights = [math.exp(v - top) for v in logs]
    total = sum(weights)
    out, running = [], 0.0
    for w in weights:
        running += w
        out.append(min(1.0, running / total))
    return out


def quantile_ranks(n: int, q: float, level: float = LEVEL) -> tuple[int | None, int | None]:
    """The 1-based ranks (l, u) of the order statistics x₍l₎ ≤ ξ_q ≤ x₍u₎ with probability ≥ ``level`` for ``n``
    samples, equal tails: the largest l with P(B ≤ l − 1) ≤ α/2 and the smallest u with P(B ≥ u) ≤ α/2, B the
    samples below ξ_q, ~ Binomial(n, q). None where no rank is far enough out (that side is unbounded)."""
    tail = (1.0 - level) / 2
    cdf = binomial_cdfs(n, q)
    below = [rank for rank in range(1, n + 1) if cdf[rank - 1] <= tail]
    above = [rank for rank in range(1, n + 1) if 1.0 - cdf[rank - 1] <= tail]
    return (max(below) if below else None), (min(above) if above else None)


def quantile_interval(samples: Sequence[float], q: float, level: float = LEVEL) -> Interval:
    """The ``level`` confidence interval of the ``q``-quantile of nonnegative ``samples`` (0 below an unbounded
    lower side, ``math.inf`` above an unbounded upper side)."""
    ordered = sorted(s for s in samples if not math.isnan(s))
    if not ordered:
        return Interval(0.0, math.inf)
    lo, hi = quantile_ranks(len(ordered), q, level)
    return Interval(ordered[lo - 1] if lo is not None else 0.0, ordered[hi - 1] if hi is not None else math.inf)


def rate_interval(amounts: Sequence[float], window_s: float, level: float = LEVEL) -> Interval:
    """The ``level`` confidence interval of a rate sum(amounts) / window_s whose events arrive as a Poisson stream
    (the compound Poisson variance Σx², normal approximation; clipped at 0)."""
    z = NormalDist().inv_cdf(0.5 + level / 2)
    total, spread = sum(amounts), z * math.sqrt(sum(a * a for a in amounts))
    if not amounts:
        return Interval(0.0, math.inf)
    return Interval(max(0.0, total - spread) / window_s, (total + spread) / window_s)


def error_interval(predicted: float, measured: Interval) -> Interval:
    """predicted / m − 1 over every m in ``measured``: the relative error's interval (−1 at an unbounded upper
    side, ``math.inf`` at a lower side of 0)."""
    lo = predicted / measured.hi - 1.0 if measured.hi < math.inf else -1.0
    hi = predicted / measured.lo - 1.0 if measured.lo > 0.0 else math.inf
    return Interval(lo, hi)


def verdict(error: float, interval: Interval, tolerance: float) -> Verdict:
    """``within``: the error itself is within ±tolerance; ``within its CI``: it is not, but some value in the
    measured figure's interval would be (the samples cannot tell); ``miss``: no value in the interval would be."""
    if abs(error) <= tolerance:
        return "within"
    if interval.lo <= tolerance and interval.hi >= -tolerance:
        return "within its CI"
    return "miss"
