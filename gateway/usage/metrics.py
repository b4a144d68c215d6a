"""The gateway's Prometheus metrics, on a registry built per app (no import-time singletons).

Label sets are bounded: ``tenant`` and ``model`` come from the config files (``tenant`` as the tenant id or its
salted hash, ``fleet.metric_labels``: every tenant label goes through ``tenant_label``), ``worker`` from the fleet file,
``tier`` from the tiers, ``reason``/``type``/``status`` from fixed sets in code — never from request data
(``type`` is the OpenAI error type of a class in ``gateway.errors``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

from fleet.metric_labels import PLAIN, TenantLabeler
from fleet.store.protocol import UsageRecord

REQUESTS: Final = "gearshift_gateway_requests"
TOKENS: Final = "gearshift_gateway_tokens"
ERRORS: Final = "gearshift_gateway_errors"
TTFT: Final = "gearshift_gateway_time_to_first_token_seconds"
TPOT: Final = "gearshift_gateway_time_per_output_token_seconds"
E2E: Final = "gearshift_gateway_request_duration_seconds"
ADMISSION_REJECTIONS: Final = "gearshift_gateway_admission_rejections"
IN_FLIGHT: Final = "gearshift_gateway_in_flight_requests"
UPSTREAM_RETRIES: Final = "gearshift_gateway_upstream_retries"
EJECTIONS: Final = "gearshift_gateway_worker_ejections"
WORKER_HEALTHY: Final = "gearshift_gateway_worker_healthy"
COST: Final = "gearshift_gateway_cost_usd"
LOOP_ERRORS: Final = "gearshift_gateway_background_errors"
LEDGER_BACKLOG: Final = "gearshift_gateway_ledger_backlog"
STORE_FAILURES: Final = "gearshift_gateway_store_failures"
STORE_UP: Final = "gearshift_gateway_store_up"
SPOOL_BYTES: Final = "gearshift_gateway_spool_bytes"
SPOOL_FULL: Final = "gearshift_gateway_spool_full"
ASYNCIO_TASKS: Final = "gearshift_gateway_asyncio_tasks"
OPEN_CONNECTIONS: Final = "gearshift_gateway_open_connections"
MULTIPROC_DIR_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
"""Set (to a directory shared by the processes) for Prometheus's multiprocess mode: ``gearshift gateway --workers``."""
SAMPLE_S: Final = 1.0
"""How often each process writes its measured gauges in multiprocess mode (``GatewayMetrics.sample``), seconds."""
QUEUE_DEPTH: Final = "gearshift_gateway_queue_depth"
QUEUED_TIME: Final = "gearshift_gateway_queued_seconds"
SHED: Final = "gearshift_gateway_shed_requests"
BROWNOUT: Final = "gearshift_gateway_brownout"
PLACEMENT_ROUTES: Final = "gearshift_gateway_placement_routes"
SPECULATION_REQUESTS: Final = "gearshift_gateway_speculation_requests"
PLAN_VERSION: Final = "gearshift_gateway_plan_version"
PLAN_FRESH: Final = "gearshift_gateway_plan_fresh"
WORKER_POOL: Final = "gearshift_gateway_worker_pool"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)


def _running_tasks() -> float:
    """Tasks of the running event loop (0 when collected outside one)."""
    try:
        return float(len(asyncio.all_tasks()))
    except RuntimeError:
        return 0.0


class GatewayMetrics:
    """Every gateway metric, registered on ``registry``."""

    def exposition(self) -> bytes:
        """The text exposition of ``/metrics``: this registry's metrics; under ``gearshift gateway --workers N``
        (``PROMETHEUS_MULTIPROC_DIR`` set) every worker process's, merged: counters and histograms summed, gauges
        one series per process (``pid``), and the measured gauges (asyncio tasks, open connections: ``measure``)
        summed over the live processes, each as its process last sampled it (at most ``SAMPLE_S`` ago; this
        process's now)."""
        if MULTIPROC_DIR_ENV in os.environ:
            self.sample()
            merged = CollectorRegistry()
            multiprocess.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
            return generate_latest(merged)
        return generate_latest(self.registry)

    @property
    def multiprocess(self) -> bool:
        """Prometheus's multiprocess mode (``gearshift gateway --workers N``): ``sample`` runs every ``SAMPLE_S``."""
        return MULTIPROC_DIR_ENV in os.environ

    def measure(self, gauge: Gauge, read: Callable[[], float]) -> None:
        """``gauge`` shows ``read()``: read at each scrape in one process; in multiprocess mode, where a scrape reads
        the processes' files, written by ``sample``."""
        if self.multiprocess:
            self._measured.append((gauge, read))
            gauge.set(read())
        else:
            gauge.set_function(read)

    def sample(self) -> None:
        """Write every measured gauge's value now (multiprocess mode: the other processes' scrapes read it)."""
        for gauge, read in self._measured:
            gauge.set(read())

    async def sample_tick(self) -> None:
        """``sample`` as a background loop's tick (``gateway.wiring``, every ``SAMPLE_S`` in multiprocess mode)."""
        self.sample()

    def __init__(self, registry: CollectorRegistry | None = None, *, tenant_label: TenantLabeler = PLAIN) -> None:
        self.registry = registry or CollectorRegistry()
        self._measured: list[tuple[Gauge, Callable[[], float]]] = []
        self.tenant_label = tenant_label
        """The ``tenant`` label of a tenant id: every metric that labels a tenant takes it from here."""
        r = self.registry
        self.requests = Counter(
            REQUESTS, "Completion requests finished", ["tenant", "model", "worker", "status"], registry=r
        )
        self.tokens = Counter(
            TOKENS, "Tokens metered (kind: prompt, completion, and cached_prompt, the part of prompt served from "
            "the worker's prefix cache)", ["tenant", "model", "kind"], registry=r,
        )  # fmt: skip
        self.errors = Counter(
            ERRORS,
            "Errors returned to clients (as a response or an in-stream event), by OpenAI error type",
            ["type"],
            registry=r,
        )
        self.ttft = Histogram(
            TTFT, "Time to first token measured at the gateway", ["tier"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            TPOT, "Time per output token after the first, at the gateway", ["tier"], buckets=_TPOT_BUCKETS, registry=r
        )
        self.e2e = Histogram(E2E, "Request duration at the gateway", ["tier"], buckets=_LATENCY_BUCKETS, registry=r)
        self.admission_rejections = Counter(
            ADMISSION_REJECTIONS, "Requests refused by a tenant limit", ["tenant", "reason"], registry=r
        )
        self.in_flight = Gauge(IN_FLIGHT, "Requests open on a worker", ["worker"], registry=r)
        self.upstream_retries = Counter(
            UPSTREAM_RETRIES,
            "Requests retried on another worker before the first byte",
            ["worker", "cause"],
            registry=r,
        )
        self.ejections = Counter(EJECTIONS, "Workers ejected after repeated failures", ["worker"], registry=r)
        self.worker_healthy = Gauge(WORKER_HEALTHY, "1 when the last health probe passed", ["worker"], registry=r)
        self.cost = Counter(COST, "Cost attributed to tenants, USD", ["tenant", "model"], registry=r)
        self.loop_errors = Counter(LOOP_ERRORS, "Failed background ticks", ["loop"], registry=r)
        self.ledger_backlog = Gauge(LEDGER_BACKLOG, "Usage records waiting to be written to the ledger", registry=r)
        self.store_failures = Counter(
            STORE_FAILURES, "Shared-store calls that failed, by operation", ["op"], registry=r
        )
        self.store_up = Gauge(STORE_UP, "1 while the shared store answers, 0 during an outage", registry=r)
        self.store_up.set(1)
        self.spool_bytes = Gauge(SPOOL_BYTES, "Usage records in the local spool, bytes", registry=r)
        self.spool_full = Gauge(SPOOL_FULL, "1 while the local usage spool is full", registry=r)
        self.asyncio_tasks = Gauge(ASYNCIO_TASKS, "asyncio tasks alive in the gateway's event loop", registry=r,
                                   multiprocess_mode="livesum")  # fmt: skip
        self.measure(self.asyncio_tasks, _running_tasks)
        self.open_connections = Gauge(OPEN_CONNECTIONS, "Client connections open on this gateway", registry=r,
                                      multiprocess_mode="livesum")  # fmt: skip
        self.queue_depth = Gauge(
            QUEUE_DEPTH, "Requests waiting in the overload queue, per model and priority band", ["model", "band"],
            registry=r,
        )  # fmt: skip
        self.queued_time = Histogram(
            QUEUED_TIME,
            "Time a request waited in the overload queue (dispatched or refused), seconds",
            ["tier"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.shed = Counter(
            SHED, "Requests the overload control refused, by tier and reason", ["tier", "reason"], registry=r
        )
        self.brownout = Gauge(BROWNOUT, "1 while the brownout caps max_tokens", registry=r)
        self.placement_routes = Counter(
            PLACEMENT_ROUTES,
            "Routing decisions of the placement filter, by outcome (home, spill, saturated, unplanned)",
            ["model", "outcome"],
            registry=r,
        )
        self.speculation_requests = Counter(
            SPECULATION_REQUESTS,
            "Completion requests finished, by speculation mode (auto, off, fast: the tier's or the request header's)",
            ["model", "speculation"],
            registry=r,
        )
        self.plan_version = Gauge(PLAN_VERSION, "Version of the fleet plan last read, per model", ["model"], registry=r)
        self.plan_fresh = Gauge(PLAN_FRESH, "1 while the model's fleet plan is within its TTL", ["model"], registry=r)
        self.worker_pool = Gauge(
            WORKER_POOL, "1 for the pool a worker is in under the fresh fleet plan", ["worker", "pool"], registry=r
        )
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._finished: dict[tuple[str, ...], _FinishedSeries] = {}
        """``finished``'s labels → the series it counts them in."""

    def child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, cached: ``labels`` validates and locks on every call, and the hot path
        makes several per request. The cache is bounded because every label set is."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def rejected(self, tenant_id: str, reason: str) -> None:
        """Count one request refused by a tenant limit (``reason``: the limit's kind)."""
        self.child(self.admission_rejections, self.tenant_label(tenant_id), reason).inc()

    def finished(self, record: UsageRecord, *, tier: str, duration_s: float) -> None:
        """Record one finished request: its usage record (tokens, USD, TTFT/TPOT seconds) and its duration at
        the gateway (seconds)."""
        key = (record.tenant, record.model, record.worker_id or "", record.status, record.speculation or "auto", tier)
        series = self._finished.get(key)
        if series is None:  # one lookup per request for its series (bounded: every label set is)
            series = self._finished[key] = _FinishedSeries(self, *key)
        series.requests.inc()
        series.prompt.inc(record.prompt_tokens)
        series.completion.inc(record.completion_tokens)
        if record.cached_tokens:  # the part of the prompt served from the worker's prefix cache
            series.cached(self).inc(record.cached_tokens)
        series.cost.inc(record.cost_usd)
        series.speculation.inc()
        series.e2e.observe(duration_s)
        if record.ttft_s is not None:
            series.ttft(self).observe(record.ttft_s)
        if record.tpot_s is not None:
            series.tpot(self).observe(record.tpot_s)


class _FinishedSeries:
    """The series ``GatewayMetrics.finished`` counts one label set's requests in. Those it may never touch (cached
    tokens, TTFT, TPOT) are made at their first use, as ``labels`` would: a series that exists is exported."""

    __slots__ = ("_cached", "_model", "_tenant", "_tier", "_tpot", "_ttft", "completion", "cost", "e2e", "prompt",
                 "requests", "speculation")  # fmt: skip

    def __init__(
        self, m: GatewayMetrics, tenant_id: str, model: str, worker: str, status: str, speculation: str, tier: str
    ) -> None:
        tenant = self._tenant = m.tenant_label(tenant_id)
        self._model, self._tier = model, tier
        self.requests = m.child(m.requests, tenant, model, worker, status)
        self.prompt = m.child(m.tokens, tenant, model, "prompt")
        self.completion = m.child(m.tokens, tenant, model, "completion")
        self.cost = m.child(m.cost, tenant, model)
        self.speculation = m.child(m.speculation_requests, model, speculation)
        self.e2e = m.child(m.e2e, tier)
        self._cached: Any = None
        self._ttft: Any = None
        self._tpot: Any = None

    def cached(self, m: GatewayMetrics) -> Any:
        if self._cached is None:
            self._cached = m.child(m.tokens, self._tenant, self._model, "cached_prompt")
        return self._cached

    def ttft(self, m: GatewayMetrics) -> Any:
        if self._ttft is None:
            self._ttft = m.child(m.ttft, self._tier)
        return self._ttft

    def tpot(self, m: GatewayMetrics) -> Any:
        if self._tpot is None:
            self._tpot = m.child(m.tpot, self._tier)
        return self._tpot
