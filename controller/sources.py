"""Metrics sources: where the controller reads each worker's vLLM metrics from (selectable by setting).

- ``HttpScrapeSource``: ``GET <worker url>/metrics`` through one shared ``httpx.AsyncClient``.
- ``PrometheusSource``: an instant query to a Prometheus server's HTTP API for the worker's series
  (selected by the ``instance`` label, i.e. the worker URL's host:port).
- ``RenderSource``: calls a render function per worker (tests of the exposition path; no HTTP).
- ``SampleSource``: calls a sample function per worker (the virtual-time lab: the same families as the
  exposition text, without rendering and parsing it).

Every source raises ``SourceError`` when a worker cannot be read; the loop marks that worker stale.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from fleet.clock import Clock
from fleet.config import WorkerConfig
from fleet.scrape import Sample, WorkerScrape, exposition_samples, parse_worker_metrics, scrape_from_samples


class SourceError(RuntimeError):
    """A worker's metrics could not be read; the message names the worker and the cause."""


class MetricsSource(Protocol):
    async def scrape(self, worker: WorkerConfig) -> WorkerScrape:
        """Read one worker's metrics now; raise ``SourceError`` on failure."""
        ...


class HttpScrapeSource:
    """Scrapes ``<url>/metrics`` of each worker."""

    def __init__(self, client: httpx.AsyncClient, *, clock: Clock, timeout_s: float = 2.0) -> None:
        self._client = client
        self._clock = clock
        self._timeout = timeout_s

    async def scrape(self, worker: WorkerConfig) -> WorkerScrape:
        url = worker.url.rstrip("/") + "/metrics"
        try:
            resp = await self._client.get(url, timeout=self._timeout)
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            raise SourceError(f"worker {worker.id}: GET {url}: {exc!r}") from exc
        try:
            return parse_worker_metrics(resp.text, at_s=self._clock.monotonic(), model=worker.model)
        except ValueError as exc:
            raise SourceError(f"worker {worker.id}: {url}: unparsable exposition: {exc}") from exc


def _instance(worker: WorkerConfig) -> str:
    return urlsplit(worker.url).netloc


def prometheus_samples(payload: Mapping[str, Any]) -> Iterator[Sample]:
    """Samples of a Prometheus ``/api/v1/query`` vector result (pure)."""
    if payload.get("status") != "success":
        raise ValueError(f"status: {payload.get('status')!r}: {payload.get('error', '')}")
    for item in payload["data"]["result"]:
        labels = dict(item["metric"])
        name = labels.pop("__name__")
        yield name, labels, float(item["value"][1])


class PrometheusSource:
    """Reads the latest scraped values from Prometheus instead of the workers themselves.

    The values are as fresh as Prometheus' scrape interval; the window arithmetic is unchanged because the
    counters are still cumulative. ``at_s`` is the controller's clock at query time.
    """

    def __init__(self, client: httpx.AsyncClient, *, base_url: str, clock: Clock, timeout_s: float = 2.0) -> None:
        self._client = client
        self._url = base_url.rstrip("/") + "/api/v1/query"
        self._clock = clock
        self._timeout = timeout_s

    async def scrape(self, worker: WorkerConfig) -> WorkerScrape:
        query = f'{{__name__=~"vllm:.*|gearshift_worker_spec_.*",instance="{_instance(worker)}"}}'
        try:
            resp = await self._client.get(self._url, params={"query": query}, timeout=self._timeout)
            resp.raise_for_status()
            samples = list(prometheus_samples(resp.json()))
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            raise SourceError(f"worker {worker.id}: Prometheus query failed: {exc!r}") from exc
        if not samples:
            raise SourceError(f"worker {worker.id}: Prometheus has no series for instance {_instance(worker)}")
        return scrape_from_samples(samples, at_s=self._clock.monotonic(), model=worker.model)


class SampleSource:
    """Reads samples ``(name, labels, value)`` from a function per worker id (in-process simulated workers in
    virtual time: the families of their exposition text, without the text)."""

    def __init__(self, collectors: Mapping[str, Callable[[], Iterable[Sample]]], *, clock: Clock) -> None:
        self._collectors = collectors
        self._clock = clock

    async def scrape(self, worker: WorkerConfig) -> WorkerScrape:
        collect = self._collectors.get(worker.id)
        if collect is None:
            raise SourceError(f"worker {worker.id}: no metrics function")
        try:
            samples = list(collect())
        except Exception as exc:  # a broken in-process worker is a stale worker, not a dead controller
            raise SourceError(f"worker {worker.id}: reading its metrics failed: {exc!r}") from exc
        return scrape_from_samples(samples, at_s=self._clock.monotonic(), model=worker.model)


class RenderSource(SampleSource):
    """Reads exposition text from a function per worker id and parses it (tests of the text path)."""

    def __init__(self, renderers: Mapping[str, Callable[[], bytes | str]], *, clock: Clock) -> None:
        super().__init__({wid: _parsed(render) for wid, render in renderers.items()}, clock=clock)


def _parsed(render: Callable[[], bytes | str]) -> Callable[[], Iterable[Sample]]:
    def samples() -> Iterable[Sample]:
        raw = render()
        return exposition_samples(raw.decode() if isinstance(raw, bytes) else raw)

    return samples
