"""One reading of a worker's ``/metrics`` (vLLM 0.32 names, DESIGN §3.2) and the difference of two readings.

Pure functions over Prometheus exposition text, parsed with ``prometheus_client``'s own parser. Counters and
gauges are summed over the ``engine`` label (a data-parallel worker exports one series per engine), except the
KV-cache fraction, which is averaged; per-position acceptance is keyed by the ``position`` label. Missing
families read as zero, except the speculation-control gauges, which read as ``None`` when the worker does not
export them. The controller, the profiler, the vLLM measurement and ``gearshift top`` all read workers
through this module; the names come from ``fleet.vllm_metrics``.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

from fleet import vllm_metrics as m
from fleet.speculation import Schedule, ScheduleRow

Sample = tuple[str, dict[str, str], float]
"""``(sample name, labels, value)`` as exposed, e.g. ``("vllm:num_requests_running", {...}, 3.0)``."""

COUNTER_FIELDS: Final = (
    "drafts",
    "draft_tokens",
    "accepted",
    "preemptions",
    "generation_tokens",
    "prompt_tokens",
    "steps",
    "iteration_tokens",
    "itl_sum_s",
    "itl_count",
    "tpot_sum_s",
    "tpot_count",
)
"""The cumulative fields of ``WorkerScrape`` (besides ``accepted_per_pos``): those a difference subtracts."""


@dataclass(frozen=True, slots=True)
class WorkerScrape:
    """One reading of a worker's metrics: cumulative counters (counts, tokens, seconds) and current gauges.

    ``later - earlier`` is the counter difference over the interval: counters are subtracted (per-position
    acceptance padded with zeros to the longer of the two), gauges, schedule and ``at_s`` are the later
    reading's. ``total + delta`` adds the counters of successive differences the same way.
    """

    at_s: float = 0.0
    """When it was read, seconds on the reader's clock (0 for a reader that keeps no time)."""
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: tuple[float, ...] = ()
    """Cumulative accepted draft tokens by position 0, 1, …"""
    preemptions: float = 0.0
    generation_tokens: float = 0.0
    prompt_tokens: float = 0.0
    steps: float = 0.0
    """Engine steps: the count of ``vllm:iteration_tokens_total``."""
    iteration_tokens: float = 0.0
    """Tokens scheduled over all steps: the sum of ``vllm:iteration_tokens_total``."""
    itl_sum_s: float = 0.0
    """Sum of inter-token latencies, seconds: one observation per request per step that emitted tokens."""
    itl_count: float = 0.0
    tpot_sum_s: float = 0.0
    """Sum of finished requests' time per output token, seconds: one observation per request."""
    tpot_count: float = 0.0
    running: float = 0.0
    """Requests the engine is running now (a gauge, like ``waiting``)."""
    waiting: float = 0.0
    kv_usage: float = 0.0
    """Fraction of the KV cache in use, 0…1."""
    spec_version: int | None = None
    spec_schedule: Schedule | None = None
    """The worker's applied schedule rows ``(from_bs, to_bs, k)`` when it exports ``gearshift_worker_spec_k``."""
    adaptive_verification: bool | None = None
    """True when the engine sizes each step's verification itself (``gearshift_worker_adaptive_verification``), so
    the schedule's k is a cap; None when the worker does not export the gauge."""

    @property
    def spec_k(self) -> int | None:
        """The largest k of the applied schedule (the k of a one-row schedule)."""
        return max(r[2] for r in self.spec_schedule) if self.spec_schedule else None

    @property
    def draft_tokens_per_draft(self) -> float | None:
        """Mean proposed draft length (≤ k: ngram proposes fewer when its match sits near the end)."""
        return self.draft_tokens / self.drafts if self.drafts else None

    @property
    def tokens_per_draft(self) -> float | None:
        """Mean tokens emitted per verifying step that carried a draft: 1 + accepted / drafts."""
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    @property
    def longest_accepted_position(self) -> int:
        """Highest draft position (0-based) with an accepted token; -1 when none was accepted."""
        return max((i for i, v in enumerate(self.accepted_per_pos) if v > 0), default=-1)

    def __sub__(self, earlier: WorkerScrape) -> WorkerScrape:
        return _combine(self, earlier, sign=-1.0, now=self)

    def __add__(self, later: WorkerScrape) -> WorkerScrape:
        return _combine(self, later, sign=1.0, now=later)


def _combine(a: WorkerScrape, b: WorkerScrape, *, sign: float, now: WorkerScrape) -> WorkerScrape:
    """Counters ``a ± b``; everything else from ``now``."""
    width = max(len(a.accepted_per_pos), len(b.accepted_per_pos))
    mine = a.accepted_per_pos + (0.0,) * (width - len(a.accepted_per_pos))
    theirs = b.accepted_per_pos + (0.0,) * (width - len(b.accepted_per_pos))
    counters = {name: getattr(a, name) + sign * getattr(b, name) for name in COUNTER_FIELDS}
    per_pos = tuple(x + sign * y for x, y in zip(mine, theirs, strict=True))
    return dataclasses.replace(now, accepted_per_pos=per_pos, **counters)


def exposition_samples(text: str) -> Iterator[Sample]:
    """Every sample of Prometheus exposition ``text`` (raises ``ValueError`` on text that is not one)."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            yield s.name, s.labels, s.value


def parse_worker_metrics(text: str, *, at_s: float = 0.0, model: str | None = None) -> WorkerScrape:
    """Read the families gearshift consumes from exposition ``text``; series of models other than ``model``
    are skipped (``None``: every model)."""
    return scrape_from_samples(exposition_samples(text), at_s=at_s, model=model)


_FIELDS: Final = {
    f"{m.SPEC_DECODE_NUM_DRAFTS}_total": "drafts",
    f"{m.SPEC_DECODE_NUM_DRAFT_TOKENS}_total": "draft_tokens",
    f"{m.SPEC_DECODE_NUM_ACCEPTED_TOKENS}_total": "accepted",
    f"{m.NUM_PREEMPTIONS}_total": "preemptions",
    f"{m.GENERATION_TOKENS}_total": "generation_tokens",
    f"{m.PROMPT_TOKENS}_total": "prompt_tokens",
    f"{m.ITERATION_TOKENS}_count": "steps",
    f"{m.ITERATION_TOKENS}_sum": "iteration_tokens",
    f"{m.INTER_TOKEN_LATENCY}_sum": "itl_sum_s",
    f"{m.INTER_TOKEN_LATENCY}_count": "itl_count",
    f"{m.REQUEST_TIME_PER_OUTPUT_TOKEN}_sum": "tpot_sum_s",
    f"{m.REQUEST_TIME_PER_OUTPUT_TOKEN}_count": "tpot_count",
    m.NUM_REQUESTS_RUNNING: "running",
    m.NUM_REQUESTS_WAITING: "waiting",
    m.KV_CACHE_USAGE_PERC: "kv_usage",
}
"""Exposed sample name → ``WorkerScrape`` field, for the fields that are plain sums over series."""
_PER_POS: Final = f"{m.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS}_total"


def scrape_from_samples(samples: Iterable[Sample], *, at_s: float = 0.0, model: str | None = None) -> WorkerScrape:
    """Fold samples (from exposition text or a Prometheus query) into one ``WorkerScrape``."""
    sums: dict[str, float] = defaultdict(float)
    kv_engines = 0
    per_pos: dict[int, float] = defaultdict(float)
    schedule: list[ScheduleRow] = []
    version: int | None = None
    adaptive: bool | None = None
    for name, labels, value in samples:
        label_model = labels.get(m.LABEL_MODEL)
        if model is not None and label_model is not None and label_model != model:
            continue
        if name in _FIELDS:
            sums[_FIELDS[name]] += value
            kv_engines += name == m.KV_CACHE_USAGE_PERC
        elif name == _PER_POS:
            per_pos[int(labels[m.LABEL_POSITION])] += value
        elif name == m.WORKER_SPEC_K:
            schedule.append((int(labels["from_bs"]), int(labels["to_bs"]), int(value)))
        elif name == m.WORKER_SPEC_VERSION:
            version = (version or 0) + int(value)
        elif name == m.WORKER_ADAPTIVE_VERIFICATION:
            adaptive = bool(adaptive) or value > 0
    if kv_engines > 1:  # a fraction per engine: average it, the other gauges add up
        sums["kv_usage"] /= kv_engines
    positions = tuple(per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)) if per_pos else ()
    return WorkerScrape(
        at_s=at_s,
        accepted_per_pos=positions,
        spec_version=version,
        spec_schedule=tuple(sorted(schedule)) or None,
        adaptive_verification=adaptive,
        **sums,
    )
