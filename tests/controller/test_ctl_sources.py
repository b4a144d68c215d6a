"""The metrics sources: a Prometheus query result folds into the same ``WorkerScrape`` as a scrape."""

from __future__ import annotations

import httpx
import pytest

from controller.sources import PrometheusSource, SourceError, prometheus_samples
from fleet.clock import ManualClock
from fleet.config import WorkerConfig
from fleet.scrape import scrape_from_samples


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
