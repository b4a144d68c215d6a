"""Cumulative counters, gauges and histogram accumulators of a simulated engine.

Everything vLLM's ``/metrics`` exposes for one engine is derived from an ``EngineStats``, so the real-time
server and the virtual-time lab render identical metrics without a live ``prometheus_client`` metric
object per worker. Times are seconds on the engine clock; token counts are tokens.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# vLLM 0.32 bucket boundaries (vllm/v1/metrics/loggers.py), so histogram quantiles match a real worker's.
ITERATION_TOKENS_BUCKETS: tuple[float, ...] = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


@dataclass
class HistogramAccumulator:
    """A Prometheus-style histogram without a registry: per-bucket counts (non-cumulative), sum, count."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    """``counts[i]`` observations ≤ ``buckets[i]`` and > ``buckets[i-1]``; the last slot is +Inf."""
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        """Record ``value`` ``times`` times (bulk observation of identical values)."""
        self.counts[bisect.bisect_left(self.buckets, value)] += times
        self.sum += value * times
        self.count += times

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper_bound, cumulative count)`` pairs ending with ``(inf, count)``."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


def _hist(buckets: tuple[float, ...]) -> HistogramAccumulator:
    return HistogramAccumulator(buckets)


@dataclass
class EngineStats:
    """Cumulative counters and current gauges of one engine (everything vLLM's ``/metrics`` needs)."""

    k_max: int
    num_drafts: int = 0
    """Request-steps that carried at least one draft token."""
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    """Accepted draft tokens by draft position 0 … k_max-1."""
    num_preemptions: int = 0
    generation_tokens: int = 0
    prompt_tokens: int = 0
    """Prompt tokens of requests whose first token was produced (vLLM counts a prompt once, at its first token)."""
    prefix_cache_queries: int = 0
    """Prompt tokens looked up in the prefix cache (each request once, at its first scheduling)."""
    prefix_cache_hits: int = 0
    """Of those, tokens found cached (they skip prefill)."""
    prompt_tokens_cached: int = 0
    """Cached prompt tokens of requests whose first token was produced (counted with ``prompt_tokens``)."""
    steps: int = 0
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    """Fraction of KV cache blocks in use, 0 … 1."""
    busy_s: float = 0.0
    target_s: float = 0.0
    drafter_s: float = 0.0
    finished_requests: int = 0
    iteration_tokens: HistogramAccumulator = field(default_factory=lambda: _hist(ITERATION_TOKENS_BUCKETS))
    ttft_s: HistogramAccumulator = field(default_factory=lambda: _hist(TTFT_BUCKETS))
    itl_s: HistogramAccumulator = field(default_factory=lambda: _hist(ITL_BUCKETS))
    tpot_s: HistogramAccumulator = field(default_factory=lambda: _hist(ITL_BUCKETS))
    e2e_s: HistogramAccumulator = field(default_factory=lambda: _hist(REQUEST_LATENCY_BUCKETS))
    queue_s: HistogramAccumulator = field(default_factory=lambda: _hist(REQUEST_LATENCY_BUCKETS))

    def __post_init__(self) -> None:
        if not self.accepted_per_pos:
            self.accepted_per_pos = [0] * self.k_max

    @property
    def mean_accepted_length(self) -> float:
        """1 + accepted / drafts: tokens per decoding request-step (1.0 when nothing was drafted)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0
