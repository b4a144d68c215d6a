"""What a virtual-time run leaves behind: one record per request, one per engine step, and summaries.

Times are seconds of virtual time since the start of the run; token counts are tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(slots=True)
class RequestRecord:
    """One request's life. ``first_token_s`` and ``finish_s`` stay NaN until they happen."""

    request_id: str
    worker_id: str
    workload: str
    prompt_tokens: int
    max_tokens: int
    arrival_s: float
    stream: int | None = None
    """Closed-loop stream that sent it (None for open-loop arrivals)."""
    phase: str = ""
    tag: str = ""
    priority: int = 0
    first_token_s: float = math.nan
    finish_s: float = math.nan
    output_tokens: int = 0

    @property
    def finished(self) -> bool:
        return not math.isnan(self.finish_s)

    @property
    def ttft_s(self) -> float:
        """Time to first token, seconds (NaN before the first token)."""
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first, seconds (vLLM's definition; NaN with < 2 tokens)."""
        if self.output_tokens < 2 or not self.finished:
            return math.nan
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def e2e_s(self) -> float:
        return self.finish_s - self.arrival_s


class StepRecord(NamedTuple):
    """One engine iteration of one worker (a named tuple: the lab makes one per step, so it must be cheap)."""

    worker: int
    """Index of the worker in the lab."""
    start_s: float
    duration_s: float
    k: int
    decode_seqs: int
    prefill_tokens: int
    tokens: int
    """Output tokens emitted by the step (bonus tokens included)."""
    target_s: float
    drafter_s: float

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(slots=True)
class RunRecords:
    """Everything recorded so far; grows while the lab runs."""

    worker_ids: tuple[str, ...]
    requests: list[RequestRecord] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)

    def finished(self, *, arrived_from_s: float = 0.0) -> list[RequestRecord]:
        """Finished requests that arrived at or after ``arrived_from_s`` (to leave a warm-up out)."""
        return [r for r in self.requests if r.finished and r.arrival_s >= arrived_from_s]

    def output_tokens(self, start_s: float, end_s: float, *, worker: int | None = None) -> int:
        """Output tokens of the steps that ended in ``(start_s, end_s]`` (on one worker, or all)."""
        return sum(
            s.tokens
            for s in self.steps
            if start_s < s.start_s + s.duration_s <= end_s and (worker is None or s.worker == worker)
        )

    def throughput(self, start_s: float, end_s: float) -> float:
        """Aggregate output tokens per second over ``(start_s, end_s]``."""
        if not end_s > start_s:
            raise ValueError(f"end_s: {end_s} must be after start_s {start_s}")
        return self.output_tokens(start_s, end_s) / (end_s - start_s)

    def tokens_per_decode_step(self, *, worker: int | None = None) -> float:
        """Mean output tokens per decoding request-step (bonus included), over steps without prefill."""
        tokens = seqs = 0
        for s in self.steps:
            if s.prefill_tokens == 0 and s.decode_seqs and (worker is None or s.worker == worker):
                tokens += s.tokens
                seqs += s.decode_seqs
        return tokens / seqs if seqs else math.nan
