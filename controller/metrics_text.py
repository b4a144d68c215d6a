"""Parse a worker's Prometheus exposition text into one ``WorkerScrape`` (a pure function, DESIGN §3.2).

Counters and gauges are summed over the ``engine`` label (a data-parallel worker exports one series per
engine); per-position acceptance is keyed by the ``position`` label. Missing families read as zero, except
the speculation-control gauges, which read as ``None`` when the worker does not export them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from fleet import vllm_metrics as m


@dataclass(frozen=True, slots=True)
class WorkerScrape:
    """One reading of a worker's metrics. Counters are cumulative; ``at_s`` is when it was read (seconds)."""

    at_s: float
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
    tpot_sum_s: float = 0.0
    tpot_count: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    """Fraction of the KV cache in use, 0…1."""
    spec_version: int | None = None
    spec_schedule: tuple[tuple[int, int, int], ...] | None = None
    """The worker's applied schedule rows ``(from_bs, to_bs, k)`` when it exports ``gearshift_worker_spec_k``."""

    @property
    def spec_k(self) -> int | None:
        """The largest k of the applied schedule (the k of a one-row schedule)."""
        return max(r[2] for r in self.spec_schedule) if self.spec_schedule else None


Sample = tuple[str, dict[str, str], float]
"""``(sample name, labels, value)`` as exposed, e.g. ``("vllm:num_requests_running", {...}, 3.0)``."""


def exposition_samples(text: str) -> Iterator[Sample]:
    """Every sample of Prometheus exposition ``text``."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            yield s.name, s.labels, s.value


def _sample_sums(
    samples: Iterable[Sample], model: str | None
) -> tuple[dict[str, float], dict[int, float], list[tuple[int, int, int]]]:
    sums: dict[str, float] = defaultdict(float)
    kv_engines = 0
    per_pos: dict[int, float] = defaultdict(float)
    schedule: list[tuple[int, int, int]] = []
    for name, labels, value in samples:
        label_model = labels.get(m.LABEL_MODEL)
        if model is not None and label_model is not None and label_model != model:
            continue
        if name == m.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS + "_total":
            per_pos[int(labels[m.LABEL_POSITION])] += value
        elif name == m.WORKER_SPEC_K:
            schedule.append((int(labels["from_bs"]), int(labels["to_bs"]), int(value)))
        else:
            sums[name] += value
            kv_engines += name == m.KV_CACHE_USAGE_PERC
    if kv_engines > 1:  # a fraction per engine: average it, the other gauges add up
        sums[m.KV_CACHE_USAGE_PERC] /= kv_engines
    return sums, per_pos, sorted(schedule)


def parse_worker_metrics(text: str, *, at_s: float, model: str | None = None) -> WorkerScrape:
    """Read the families gearshift consumes from exposition ``text`` (series of other models are skipped)."""
    return scrape_from_samples(exposition_samples(text), at_s=at_s, model=model)


def scrape_from_samples(samples: Iterable[Sample], *, at_s: float, model: str | None = None) -> WorkerScrape:
    """Fold samples (from exposition text or a Prometheus query) into one ``WorkerScrape``."""
    sums, per_pos, schedule = _sample_sums(samples, model)
    positions = tuple(per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)) if per_pos else ()
    version = sums.get(m.WORKER_SPEC_VERSION)
    return WorkerScrape(
        at_s=at_s,
        drafts=sums[m.SPEC_DECODE_NUM_DRAFTS + "_total"],
        draft_tokens=sums[m.SPEC_DECODE_NUM_DRAFT_TOKENS + "_total"],
        accepted=sums[m.SPEC_DECODE_NUM_ACCEPTED_TOKENS + "_total"],
        accepted_per_pos=positions,
        preemptions=sums[m.NUM_PREEMPTIONS + "_total"],
        generation_tokens=sums[m.GENERATION_TOKENS + "_total"],
        prompt_tokens=sums[m.PROMPT_TOKENS + "_total"],
        steps=sums[m.ITERATION_TOKENS + "_count"],
        iteration_tokens=sums[m.ITERATION_TOKENS + "_sum"],
        tpot_sum_s=sums[m.REQUEST_TIME_PER_OUTPUT_TOKEN + "_sum"],
        tpot_count=sums[m.REQUEST_TIME_PER_OUTPUT_TOKEN + "_count"],
        running=sums[m.NUM_REQUESTS_RUNNING],
        waiting=sums[m.NUM_REQUESTS_WAITING],
        kv_usage=sums[m.KV_CACHE_USAGE_PERC],
        spec_version=int(version) if version is not None else None,
        spec_schedule=tuple(schedule) or None,
    )
