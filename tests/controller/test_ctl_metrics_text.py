"""Parsing /metrics text produced by a real prometheus_client registry with vLLM's exact names."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from controller.metrics_text import parse_worker_metrics, scrape_from_samples
from controller.sources import PrometheusSource, SourceError, prometheus_samples
from fleet import vllm_metrics as m
from fleet.clock import ManualClock
from fleet.config import WorkerConfig

LABELS = [m.LABEL_MODEL, m.LABEL_ENGINE]


def vllm_registry(engines: dict[str, dict[str, float]], *, model: str = "kimi-k3") -> bytes:
    """Exposition text of a worker with one series per engine, values from ``engines[engine]``."""
    r = CollectorRegistry()
    counters = {
        name: Counter(name, name, LABELS, registry=r)
        for name in (m.SPEC_DECODE_NUM_DRAFTS, m.SPEC_DECODE_NUM_DRAFT_TOKENS, m.SPEC_DECODE_NUM_ACCEPTED_TOKENS,
                     m.NUM_PREEMPTIONS, m.GENERATION_TOKENS, m.PROMPT_TOKENS)
    }  # fmt: skip
    per_pos = Counter(m.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS, "x", [*LABELS, m.LABEL_POSITION], registry=r)
    gauges = {
        name: Gauge(name, name, LABELS, registry=r)
        for name in (m.NUM_REQUESTS_RUNNING, m.NUM_REQUESTS_WAITING, m.KV_CACHE_USAGE_PERC)
    }
    iteration = Histogram(m.ITERATION_TOKENS, "x", LABELS, buckets=(1, 8, 16, 64), registry=r)
    tpot = Histogram(m.REQUEST_TIME_PER_OUTPUT_TOKEN, "x", LABELS, registry=r)
    for engine, v in engines.items():
        values = [model, engine]
        for name, c in counters.items():
            c.labels(*values).inc(v.get(name, 0.0))
        for pos in range(3):
            per_pos.labels(*values, str(pos)).inc(v.get(f"pos{pos}", 0.0))
        for name, g in gauges.items():
            g.labels(*values).set(v.get(name, 0.0))
        for tokens in v.get("steps", ()):  # type: ignore[attr-defined]
            iteration.labels(*values).observe(tokens)
        tpot.labels(*values).observe(0.02)
    spec_k = Gauge(m.WORKER_SPEC_K, "k", ["from_bs", "to_bs"], registry=r)
    spec_k.labels("1", "256").set(4)
    Gauge(m.WORKER_SPEC_VERSION, "v", registry=r).set(7)
    return generate_latest(r)


def test_parses_vllm_names_and_sums_engines() -> None:
    text = vllm_registry(
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
                "steps": [8, 8, 16],
            },
            "1": {
                m.SPEC_DECODE_NUM_DRAFTS: 50,
                "pos0": 40,
                m.NUM_REQUESTS_RUNNING: 2,
                m.KV_CACHE_USAGE_PERC: 0.3,
                "steps": [4],
            },
        }
    ).decode()
    s = parse_worker_metrics(text, at_s=12.5, model="kimi-k3")
    assert s.at_s == 12.5
    assert s.drafts == 150
    assert s.accepted == 150
    assert s.accepted_per_pos == (120, 50, 20)
    assert s.running == 5
    assert s.kv_usage == pytest.approx(0.4)  # a fraction per engine is averaged, not added
    assert s.generation_tokens == 400
    assert s.steps == 4
    assert s.iteration_tokens == 36
    assert s.tpot_count == 2
    assert s.spec_schedule == ((1, 256, 4),)
    assert s.spec_k == 4
    assert s.spec_version == 7


def test_skips_other_models_and_reads_missing_as_zero() -> None:
    text = vllm_registry({"0": {m.SPEC_DECODE_NUM_DRAFTS: 9}}, model="other").decode()
    s = parse_worker_metrics(text, at_s=0.0, model="kimi-k3")
    assert s.drafts == 0
    assert s.accepted_per_pos == ()
    assert s.spec_k == 4  # worker-level gauges carry no model label


def test_worker_without_gearshift_gauges() -> None:
    s = parse_worker_metrics("# nothing here\n", at_s=0.0)
    assert s.spec_version is None
    assert s.spec_k is None


def test_prometheus_query_result_folds_the_same_way() -> None:
    payload = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": {"__name__": "vllm:spec_decode_num_drafts_total", "model_name": "kimi-k3", "engine": "0",
                            "instance": "w:1"}, "value": [1.0, "42"]},
                {"metric": {"__name__": "vllm:spec_decode_num_accepted_tokens_per_pos_total", "position": "1",
                            "model_name": "kimi-k3", "engine": "0"}, "value": [1.0, "7"]},
                {"metric": {"__name__": "vllm:num_requests_running", "model_name": "kimi-k3", "engine": "0"},
                 "value": [1.0, "3"]},
            ],
        },
    }  # fmt: skip
    s = scrape_from_samples(prometheus_samples(payload), at_s=1.0, model="kimi-k3")
    assert (s.drafts, s.accepted_per_pos, s.running) == (42, (0.0, 7), 3)


def test_prometheus_error_payload_raises() -> None:
    with pytest.raises(ValueError, match="status"):
        list(prometheus_samples({"status": "error", "error": "bad query"}))


async def test_prometheus_source_queries_the_workers_instance() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.params["query"])
        sample = {"metric": {"__name__": "vllm:num_requests_waiting", "model_name": "kimi-k3"}, "value": [0, "4"]}
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": [sample]}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        source = PrometheusSource(client, base_url="http://prom:9090", clock=ManualClock())
        s = await source.scrape(WorkerConfig(id="w", url="http://10.0.0.7:8000", model="kimi-k3"))
    assert s.waiting == 4
    assert 'instance="10.0.0.7:8000"' in seen[0]


async def test_prometheus_source_without_series_is_a_source_error() -> None:
    empty = {"status": "success", "data": {"resultType": "vector", "result": []}}
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=empty))
    async with httpx.AsyncClient(transport=transport) as client:
        source = PrometheusSource(client, base_url="http://prom:9090", clock=ManualClock())
        with pytest.raises(SourceError, match="no series"):
            await source.scrape(WorkerConfig(id="w", url="http://10.0.0.7:8000", model="kimi-k3"))
