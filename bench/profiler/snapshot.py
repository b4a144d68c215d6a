"""One scrape of a worker's ``/metrics``: the counters the profiler differences (vLLM 0.32 names, DESIGN §3.2).

Times are in the worker's own clock (a simulated worker reports simulated seconds), so step times measured
from these counters do not depend on how fast the profiler itself runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from fleet import vllm_metrics as names


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Cumulative counters and current gauges of one engine (summed over engines when there are several)."""

    steps: float = 0.0
    """Engine steps: the count of ``vllm:iteration_tokens_total``."""
    itl_sum_s: float = 0.0
    """Sum of inter-token latencies, seconds: one observation per request per step that emitted tokens."""
    itl_count: float = 0.0
    generation_tokens: float = 0.0
    prompt_tokens: float = 0.0
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_per_pos: tuple[float, ...] = ()
    running: float = 0.0
    waiting: float = 0.0

    def __sub__(self, other: Snapshot) -> Snapshot:
        width = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        mine = self.accepted_per_pos + (0.0,) * (width - len(self.accepted_per_pos))
        theirs = other.accepted_per_pos + (0.0,) * (width - len(other.accepted_per_pos))
        return Snapshot(
            steps=self.steps - other.steps,
            itl_sum_s=self.itl_sum_s - other.itl_sum_s,
            itl_count=self.itl_count - other.itl_count,
            generation_tokens=self.generation_tokens - other.generation_tokens,
            prompt_tokens=self.prompt_tokens - other.prompt_tokens,
            drafts=self.drafts - other.drafts,
            draft_tokens=self.draft_tokens - other.draft_tokens,
            accepted_per_pos=tuple(a - b for a, b in zip(mine, theirs, strict=True)),
            running=self.running,
            waiting=self.waiting,
        )


_SCALARS = {
    f"{names.ITERATION_TOKENS}_count": "steps",
    f"{names.INTER_TOKEN_LATENCY}_sum": "itl_sum_s",
    f"{names.INTER_TOKEN_LATENCY}_count": "itl_count",
    f"{names.GENERATION_TOKENS}_total": "generation_tokens",
    f"{names.PROMPT_TOKENS}_total": "prompt_tokens",
    f"{names.SPEC_DECODE_NUM_DRAFTS}_total": "drafts",
    f"{names.SPEC_DECODE_NUM_DRAFT_TOKENS}_total": "draft_tokens",
    names.NUM_REQUESTS_RUNNING: "running",
    names.NUM_REQUESTS_WAITING: "waiting",
}


def parse_snapshot(text: str) -> Snapshot:
    """Parse a Prometheus text exposition; metrics it lacks read as 0 (a worker that never drafted)."""
    values = dict.fromkeys(_SCALARS.values(), 0.0)
    per_pos: dict[int, float] = {}
    per_pos_name = f"{names.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS}_total"
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            field = _SCALARS.get(sample.name)
            if field is not None:
                values[field] += sample.value
            elif sample.name == per_pos_name:
                pos = int(sample.labels[names.LABEL_POSITION])
                per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
    accepted = tuple(per_pos.get(i, 0.0) for i in range(max(per_pos, default=-1) + 1))
    return Snapshot(accepted_per_pos=accepted, **values)
