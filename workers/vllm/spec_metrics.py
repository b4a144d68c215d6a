"""The worker metrics gearshift adds beside vLLM's own on vLLM's ``/metrics`` (DESIGN §3.1)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from fleet import vllm_metrics as names
from fleet.speculation import SpeculationState


class WorkerSpecMetrics:
    """Mirrors the engine's schedule into Prometheus metrics in the API server process.

    Gauges use ``multiprocess_mode="mostrecent"`` so they stay right if vLLM runs several API server
    processes with ``PROMETHEUS_MULTIPROC_DIR``; with one API server (the default) they live in ``registry``.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._k = Gauge(
            names.WORKER_SPEC_K,
            "Speculation length k applied to decode batches of from_bs…to_bs sequences.",
            ["from_bs", "to_bs"],
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        self._version = Gauge(
            names.WORKER_SPEC_VERSION,
            "Version of the applied speculation schedule (0 = the start-up schedule).",
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        self._expired = Counter(
            names.WORKER_SPEC_LEASE_EXPIRED,
            "Times a speculation schedule's lease ran out and the worker fell back to its start-up schedule.",
            registry=registry,
        )
        self._rows: tuple[tuple[int, int, int], ...] = ()
        self._expiries_seen = 0

    def observe(self, state: SpeculationState, lease_expiries: int) -> None:
        """Record the engine's latest state; ``lease_expiries`` is the engine's running count."""
        rows = tuple((r[0], r[1], r[2]) for r in state.schedule)
        if rows != self._rows:
            self._k.clear()
            for from_bs, to_bs, k in rows:
                self._k.labels(from_bs=str(from_bs), to_bs=str(to_bs)).set(k)
            self._rows = rows
        self._version.set(state.version)
        if lease_expiries > self._expiries_seen:
            self._expired.inc(lease_expiries - self._expiries_seen)
        self._expiries_seen = lease_expiries
