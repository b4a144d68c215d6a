"""Prometheus exposition of a simulated worker, with vLLM 0.32's exact metric names, types and labels.

A custom collector turns an ``EngineStats`` and a ``SpeculationControl`` into metric families at scrape
time, so the same code serves ``GET /metrics`` in real time and ``render()`` in virtual time (no server).
Label order follows vLLM (``model_name``, ``engine``, then ``position`` / ``reason``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from fleet import vllm_metrics as names
from fleet.speculation import SpeculationControl
from workers.sim.stats import EngineStats, HistogramAccumulator

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Content type of the text exposition format (what vLLM's ``/metrics`` answers with)."""

_LABELS = [names.LABEL_MODEL, names.LABEL_ENGINE]

Sample = tuple[str, dict[str, str], float]
"""One exposed sample: ``(name, labels, value)``."""

# (family name, help text, attribute of EngineStats) — help texts are vLLM's own.
_COUNTERS: tuple[tuple[str, str, str], ...] = (
    (names.SPEC_DECODE_NUM_DRAFTS, "Number of spec decoding drafts.", "num_drafts"),
    (names.SPEC_DECODE_NUM_DRAFT_TOKENS, "Number of draft tokens.", "num_draft_tokens"),
    (names.SPEC_DECODE_NUM_ACCEPTED_TOKENS, "Number of accepted tokens.", "num_accepted_tokens"),
    (names.NUM_PREEMPTIONS, "Cumulative number of preemption from the engine.", "num_preemptions"),
    (names.PROMPT_TOKENS, "Number of prefill tokens processed.", "prompt_tokens"),
    (names.GENERATION_TOKENS, "Number of generation tokens processed.", "generation_tokens"),
    (
        names.PREFIX_CACHE_QUERIES,
        "Prefix cache queries, in terms of number of queried tokens.",
        "prefix_cache_queries",
    ),
    (names.PREFIX_CACHE_HITS, "Prefix cache hits, in terms of number of cached tokens.", "prefix_cache_hits"),
    (names.PROMPT_TOKENS_CACHED, "Number of cached prompt tokens (local + external).", "prompt_tokens_cached"),
)
_HISTOGRAMS: tuple[tuple[str, str, str], ...] = (
    (names.ITERATION_TOKENS, "Histogram of number of tokens per engine_step.", "iteration_tokens"),
    (names.TIME_TO_FIRST_TOKEN, "Histogram of time to first token in seconds.", "ttft_s"),
    (names.INTER_TOKEN_LATENCY, "Histogram of inter-token latency in seconds.", "itl_s"),
    (
        names.REQUEST_TIME_PER_OUTPUT_TOKEN,
        "Histogram of time_per_output_token_seconds per request.",
        "tpot_s",
    ),
    (names.E2E_REQUEST_LATENCY, "Histogram of e2e request latency in seconds.", "e2e_s"),
    (names.REQUEST_QUEUE_TIME, "Histogram of time spent in WAITING phase for request.", "queue_s"),
)


def _le(bound: float) -> str:
    """Bucket bound as prometheus_client writes it (``1.0``, ``0.25``, ``+Inf``)."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


class SimWorkerCollector(Collector):
    """Collects one simulated engine's metrics. ``stats`` is called at every scrape (it refreshes gauges)."""

    def __init__(
        self,
        stats: Callable[[], EngineStats],
        control: SpeculationControl,
        *,
        model_name: str,
        engine_index: int = 0,
        adaptive_verification: Callable[[], bool] = lambda: False,
    ) -> None:
        self._stats = stats
        self._control = control
        self._values = [model_name, str(engine_index)]
        self._adaptive = adaptive_verification

    def collect(self) -> Iterator[Metric]:
        st = self._stats()
        yield from self._scheduler(st)
        for name, doc, attr in _COUNTERS:
            fam = CounterMetricFamily(name, doc, labels=_LABELS)
            fam.add_metric(self._values, float(getattr(st, attr)))
            yield fam
        per_pos = CounterMetricFamily(
            names.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS,
            "Accepted tokens per draft position.",
            labels=[*_LABELS, names.LABEL_POSITION],
        )
        for pos, count in enumerate(st.accepted_per_pos):
            per_pos.add_metric([*self._values, str(pos)], float(count))
        yield per_pos
        for name, doc, attr in _HISTOGRAMS:
            yield self._histogram(name, doc, getattr(st, attr))
        yield from self._speculation()

    def samples(self) -> Iterator[Sample]:
        """What ``collect()``'s families hold as samples, ``(name, labels, value)`` in the same order with the same
        types, built without the families."""
        st = self._stats()
        model, engine = self._values
        labels = {names.LABEL_MODEL: model, names.LABEL_ENGINE: engine}
        yield names.NUM_REQUESTS_RUNNING, dict(labels), float(st.running)
        yield names.NUM_REQUESTS_WAITING, dict(labels), float(st.waiting)
        yield names.NUM_REQUESTS_WAITING_BY_REASON, {**labels, names.LABEL_REASON: "capacity"}, float(st.waiting)
        yield names.NUM_REQUESTS_WAITING_BY_REASON, {**labels, names.LABEL_REASON: "deferred"}, 0.0
        yield names.KV_CACHE_USAGE_PERC, dict(labels), st.kv_usage
        for name, _, attr in _COUNTERS:
            yield f"{name}_total", dict(labels), float(getattr(st, attr))
        per_pos = f"{names.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS}_total"
        for pos, count in enumerate(st.accepted_per_pos):
            yield per_pos, {**labels, names.LABEL_POSITION: str(pos)}, float(count)
        for name, _, attr in _HISTOGRAMS:
            acc: HistogramAccumulator = getattr(st, attr)
            bucket = f"{name}_bucket"
            last = 0.0
            for bound, count in acc.cumulative():
                last = float(count)
                yield bucket, {**labels, "le": _le(bound)}, last
            yield f"{name}_count", dict(labels), last
            yield f"{name}_sum", dict(labels), acc.sum
        ctl = self._control
        for from_bs, to_bs, k_value in ctl.schedule:
            yield names.WORKER_SPEC_K, {"from_bs": str(from_bs), "to_bs": str(to_bs)}, float(k_value)
        yield names.WORKER_SPEC_VERSION, {}, float(ctl.version)
        yield f"{names.WORKER_SPEC_LEASE_EXPIRED}_total", {}, float(ctl.lease_expiries)
        yield names.WORKER_ADAPTIVE_VERIFICATION, {}, 1.0 if self._adaptive() else 0.0

    def _scheduler(self, st: EngineStats) -> Iterator[Metric]:
        running = GaugeMetricFamily(
            names.NUM_REQUESTS_RUNNING, "Number of requests in model execution batches.", labels=_LABELS
        )
        running.add_metric(self._values, float(st.running))
        waiting = GaugeMetricFamily(
            names.NUM_REQUESTS_WAITING, "Number of requests waiting to be processed.", labels=_LABELS
        )
        waiting.add_metric(self._values, float(st.waiting))
        by_reason = GaugeMetricFamily(
            names.NUM_REQUESTS_WAITING_BY_REASON,
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
            "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
            "Sum of all reasons equals vllm:num_requests_waiting.",
            labels=[*_LABELS, names.LABEL_REASON],
        )
        # The simulator has no LoRA budget or KV transfer: every waiting request waits for capacity.
        by_reason.add_metric([*self._values, "capacity"], float(st.waiting))
        by_reason.add_metric([*self._values, "deferred"], 0.0)
        kv = GaugeMetricFamily(names.KV_CACHE_USAGE_PERC, "KV-cache usage. 1 means 100 percent usage.", labels=_LABELS)
        kv.add_metric(self._values, st.kv_usage)
        yield from (running, waiting, by_reason, kv)

    def _histogram(self, name: str, doc: str, acc: HistogramAccumulator) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(name, doc, labels=_LABELS)
        buckets = [(_le(bound), float(count)) for bound, count in acc.cumulative()]
        fam.add_metric(self._values, buckets, acc.sum)
        return fam

    def _speculation(self) -> Iterator[Metric]:
        ctl = self._control
        k = GaugeMetricFamily(
            names.WORKER_SPEC_K,
            "Speculation length k applied to decode batches of from_bs … to_bs sequences (0 = off).",
            labels=["from_bs", "to_bs"],
        )
        for from_bs, to_bs, k_value in ctl.schedule:
            k.add_metric([str(from_bs), str(to_bs)], float(k_value))
        version = GaugeMetricFamily(names.WORKER_SPEC_VERSION, "Version of the applied speculation schedule.")
        version.add_metric([], float(ctl.version))
        expired = CounterMetricFamily(
            names.WORKER_SPEC_LEASE_EXPIRED,
            "Times a speculation schedule's lease ran out and the worker fell back to its start-up schedule.",
        )
        expired.add_metric([], float(ctl.lease_expiries))
        adaptive = GaugeMetricFamily(
            names.WORKER_ADAPTIVE_VERIFICATION,
            "1 when the engine chooses per step how many drafted tokens to verify (DSpark adaptive verification); "
            "the schedule's k is then a cap.",
        )
        adaptive.add_metric([], 1.0 if self._adaptive() else 0.0)
        yield from (k, version, expired, adaptive)


class SimWorkerMetrics:
    """A registry holding one worker's collector; ``render()`` gives the exposition text as bytes."""

    def __init__(
        self,
        stats: Callable[[], EngineStats],
        control: SpeculationControl,
        *,
        model_name: str,
        engine_index: int = 0,
        adaptive_verification: Callable[[], bool] = lambda: False,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        collector = SimWorkerCollector(
            stats,
            control,
            model_name=model_name,
            engine_index=engine_index,
            adaptive_verification=adaptive_verification,
        )
        self.registry.register(collector)

        self._collector = collector

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def samples(self) -> Iterator[Sample]:
        """The samples ``render()`` writes, as ``(name, labels, value)``, without the text: built directly, without
        the metric families (the lab's controller reads every worker this way at every tick)."""
        return self._collector.samples()

    def family_samples(self) -> Iterator[Sample]:
        """The same samples read from the registry's metric families (the definition ``samples`` must equal)."""
        for family in self.registry.collect():
            for sample in family.samples:
                yield sample.name, sample.labels, sample.value


def render(stats: EngineStats, control: SpeculationControl, *, model_name: str, engine_index: int = 0) -> bytes:
    """One-shot exposition of ``stats`` and ``control`` (for virtual-time scrapes without a server)."""
    return SimWorkerMetrics(lambda: stats, control, model_name=model_name, engine_index=engine_index).render()
