"""Parsing /metrics text produced by a real prometheus_client registry with vLLM's exact names, and the counter
difference of two readings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from fleet import vllm_metrics as m
from fleet.scrape import WorkerScrape, exposition_samples, parse_worker_metrics

LABELS = [m.LABEL_MODEL, m.LABEL_ENGINE]
COUNTERS = (
    m.SPEC_DECODE_NUM_DRAFTS,
    m.SPEC_DECODE_NUM_DRAFT_TOKENS,
    m.SPEC_DECODE_NUM_ACCEPTED_TOKENS,
    m.NUM_PREEMPTIONS,
    m.GENERATION_TOKENS,
    m.PROMPT_TOKENS,
)
GAUGES = (m.NUM_REQUESTS_RUNNING, m.NUM_REQUESTS_WAITING, m.KV_CACHE_USAGE_PERC)


def worker_text(
    engines: Mapping[str, Mapping[str, float]],
    *,
    model: str = "kimi-k3",
    steps: Mapping[str, Sequence[float]] | None = None,
    itl_s: Mapping[str, Sequence[float]] | None = None,
    schedule: Sequence[tuple[int, int, int]] = ((1, 256, 4),),
    version: int | None = 7,
) -> str:
    """Exposition text of a worker with one series per engine: counter and gauge values from ``engines[engine]``
    (``"pos<i>"`` for accepted tokens at position i), iteration-token and ITL observations per engine."""
    r = CollectorRegistry()
    counters = {name: Counter(name, name, LABELS, registry=r) for name in COUNTERS}
    per_pos = Counter(m.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS, "x", [*LABELS, m.LABEL_POSITION], registry=r)
    gauges = {name: Gauge(name, name, LABELS, registry=r) for name in GAUGES}
    iteration = Histogram(m.ITERATION_TOKENS, "x", LABELS, buckets=(1, 8, 16, 64), registry=r)
    itl = Histogram(m.INTER_TOKEN_LATENCY, "x", LABELS, registry=r)
    tpot = Histogram(m.REQUEST_TIME_PER_OUTPUT_TOKEN, "x", LABELS, registry=r)
    for engine, v in engines.items():
        values = [model, engine]
        for name, c in counters.items():
            c.labels(*values).inc(v.get(name, 0.0))
        for pos in range(3):
            per_pos.labels(*values, str(pos)).inc(v.get(f"pos{pos}", 0.0))
        for name, g in gauges.items():
            g.labels(*values).set(v.get(name, 0.0))
        for tokens in (steps or {}).get(engine, ()):
            iteration.labels(*values).observe(tokens)
        for seconds in (itl_s or {}).get(engine, ()):
            itl.labels(*values).observe(seconds)
        tpot.labels(*values).observe(0.02)
    if schedule:
        spec_k = Gauge(m.WORKER_SPEC_K, "k", ["from_bs", "to_bs"], registry=r)
        for from_bs, to_bs, k in schedule:
            spec_k.labels(str(from_bs), str(to_bs)).set(k)
    if version is not None:
        Gauge(m.WORKER_SPEC_VERSION, "v", registry=r).set(version)
    return generate_latest(r).decode()


def test_parses_vllm_names_and_sums_engines() -> None:
    text = worker_text(
        {
            "0": {
                m.SPEC_DECODE_NUM_DRAFTS: 100,
                m.SPEC_DECODE_NUM_ACCEPTED_TOKENS: 150,
                "pos0": 80,
                "pos1": 50,
                "pos2": 20,
                m.NUM_REQUESTS_RUNNING: 3,
                m.KV_CACHE_USAGE_PERC: 0.5,
                m.GENERATION_TOKENS: 400,
            },
            "1": {m.SPEC_DECODE_NUM_DRAFTS: 50, "pos0": 40, m.NUM_REQUESTS_RUNNING: 2, m.KV_CACHE_USAGE_PERC: 0.3},
        },
        steps={"0": [8, 8, 16], "1": [4]},
        itl_s={"0": [0.25, 0.25], "1": [0.5]},
        schedule=((5, 256, 2), (1, 4, 6)),
    )
    s = parse_worker_metrics(text, at_s=12.5, model="kimi-k3")
    assert s.at_s == 12.5
    assert (s.drafts, s.accepted, s.accepted_per_pos) == (150, 150, (120, 50, 20))
    assert s.running == 5
    assert s.kv_usage == pytest.approx(0.4)  # a fraction per engine is averaged, not added
    assert s.generation_tokens == 400
    assert (s.steps, s.iteration_tokens) == (4, 36)
    assert (s.itl_sum_s, s.itl_count) == (1.0, 3)
    assert s.tpot_sum_s == pytest.approx(0.04)
    assert s.tpot_count == 2
    assert s.spec_schedule == ((1, 4, 6), (5, 256, 2))  # sorted by batch size
    assert s.spec_k == 6
    assert s.spec_version == 7


def test_skips_other_models_but_not_the_worker_gauges() -> None:
    text = worker_text({"0": {m.SPEC_DECODE_NUM_DRAFTS: 9, "pos1": 3}}, model="other")
    s = parse_worker_metrics(text, model="kimi-k3")
    assert (s.drafts, s.accepted_per_pos) == (0, ())
    assert s.spec_k == 4  # worker-level gauges carry no model label
    assert parse_worker_metrics(text).drafts == 9  # no model: every series counts


def test_missing_families_read_as_zero_and_the_gearshift_gauges_as_none() -> None:
    s = parse_worker_metrics(worker_text({}, schedule=(), version=None))
    assert s == WorkerScrape()
    assert (s.spec_version, s.spec_k, s.tokens_per_draft, s.draft_tokens_per_draft) == (None, None, None, None)
    assert s.longest_accepted_position == -1


def test_exposition_samples_are_the_registry_samples() -> None:
    samples = list(exposition_samples(worker_text({"0": {m.NUM_REQUESTS_WAITING: 2}}, schedule=(), version=None)))
    assert (m.NUM_REQUESTS_WAITING, {m.LABEL_MODEL: "kimi-k3", m.LABEL_ENGINE: "0"}, 2.0) in samples


def test_not_an_exposition_raises_value_error() -> None:
    with pytest.raises(ValueError, match="Invalid"):
        parse_worker_metrics("vllm:num_requests_running{engine=0} 3\n")


def spec_text(drafts: float, draft_tokens: float, accepted_per_pos: list[float], generated: float) -> str:
    values = {
        m.SPEC_DECODE_NUM_DRAFTS: drafts,
        m.SPEC_DECODE_NUM_DRAFT_TOKENS: draft_tokens,
        m.SPEC_DECODE_NUM_ACCEPTED_TOKENS: sum(accepted_per_pos),
        m.GENERATION_TOKENS: generated,
        **{f"pos{i}": v for i, v in enumerate(accepted_per_pos)},
    }
    return worker_text({"0": values}, schedule=(), version=None)


def test_speculation_ratios() -> None:
    counters = parse_worker_metrics(spec_text(10, 35, [9, 8, 7], 200))
    assert (counters.drafts, counters.draft_tokens, counters.accepted) == (10, 35, 24)
    assert counters.accepted_per_pos == (9, 8, 7)
    assert counters.draft_tokens_per_draft == 3.5
    assert counters.tokens_per_draft == 3.4
    assert counters.longest_accepted_position == 2


def test_difference_subtracts_counters_and_keeps_the_later_gauges() -> None:
    before = parse_worker_metrics(
        worker_text({"0": {m.SPEC_DECODE_NUM_DRAFTS: 10, "pos0": 9, m.NUM_REQUESTS_RUNNING: 1}}, steps={"0": [4]}),
        at_s=1.0,
    )
    after = parse_worker_metrics(
        worker_text(
            {"0": {m.SPEC_DECODE_NUM_DRAFTS: 14, "pos0": 13, "pos1": 4, m.NUM_REQUESTS_RUNNING: 3}},
            steps={"0": [4, 4, 4]},
            schedule=((1, 256, 2),),
        ),
        at_s=3.0,
    )
    delta = after - before
    assert (delta.drafts, delta.accepted_per_pos, delta.steps, delta.iteration_tokens) == (4, (4, 4, 0), 2, 8)
    assert delta.tpot_count == 0
    assert (delta.running, delta.at_s, delta.spec_k, delta.spec_version) == (3, 3.0, 2, 7)
    assert delta.longest_accepted_position == 1


def test_sum_of_differences_pads_positions() -> None:
    a = WorkerScrape(drafts=1, draft_tokens=2, accepted=2, accepted_per_pos=(1, 1), generation_tokens=3)
    b = WorkerScrape(drafts=2, draft_tokens=6, accepted=3, accepted_per_pos=(2, 1, 0), generation_tokens=9, running=4)
    total = sum((a, b), start=WorkerScrape())
    assert total == WorkerScrape(
        drafts=3, draft_tokens=8, accepted=5, accepted_per_pos=(3, 2, 0), generation_tokens=12, running=4
    )
