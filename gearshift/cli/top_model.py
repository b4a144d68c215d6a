"""The numbers ``gearshift top`` shows, computed from two snapshots of the fleet (pure functions).

A snapshot holds, per worker, its parsed ``/metrics`` and the state the controller published, and the
gateway's ``/metrics`` text. Rates (tokens/s, requests/s) and latency quantiles come from the difference of
two snapshots, the way Prometheus's ``rate`` and ``histogram_quantile`` would compute them over that window.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from fleet.config import FleetConfig, TenantsConfig
from fleet.metric_labels import PLAIN, TenantLabeler
from fleet.scrape import WorkerScrape, exposition_samples
from fleet.store.protocol import WorkerState
from fleet.worker_mode import Mode, Phase, WorkerMode
from gateway.usage import metrics as gm


@dataclass(frozen=True)
class WorkerSample:
    """One worker at one moment: ``scrape`` is None when its ``/metrics`` did not answer."""

    worker_id: str
    model: str
    scrape: WorkerScrape | None = None
    state: WorkerState | None = None
    healthy: bool | None = None
    """The gateway's health view; None when unknown."""
    mode: WorkerMode | None = None
    """Its drafter-free gear record (``fleet.worker_mode``); None: none."""


@dataclass(frozen=True)
class GatewaySample:
    """Cumulative gateway counters: requests by tenant, and TPOT histogram buckets by tier (le → count)."""

    requests: Mapping[str, float] = field(default_factory=dict)
    tpot_buckets: Mapping[str, Mapping[float, float]] = field(default_factory=dict)
    pools: Mapping[str, str] = field(default_factory=dict)
    """Worker id → its pool under the fresh fleet plan the gateway follows (absent: none)."""


@dataclass(frozen=True)
class Snapshot:
    at_s: float
    """When the snapshot was taken, seconds (any monotonic origin)."""
    workers: Mapping[str, WorkerSample]
    gateway: GatewaySample | None = None


@dataclass(frozen=True)
class WorkerRow:
    worker_id: str
    model: str
    k_desired: int | None
    k_applied: int | None
    accepted_length: float | None
    running: float | None
    waiting: float | None
    kv_usage: float | None
    """Fraction of the KV cache in use, 0…1."""
    tokens_per_s: float | None
    """Output tokens per second over the window."""
    usd_per_mtok: float | None
    reason: str
    status: str
    """``ok``, ``down`` (no metrics), ``unhealthy`` (gateway probe failing), ``stale`` (controller flag), or
    ``draining``/``restarting`` (a move to or from the drafter-free gear)."""
    pool: str | None = None
    """Its pool in the fleet plan the gateway follows; None: no fresh plan places it."""
    drafter_free: bool = False
    """Runs without its drafter (the drafter-free gear: k = 0 with no idle-drafter tax)."""


@dataclass(frozen=True)
class TenantRow:
    tenant: str
    tier: str
    requests_per_s: float | None
    tpot_p99_s: float | None
    """p99 time per output token of the tenant's tier over the window, seconds."""
    tpot_target_s: float | None


def parse_gateway(text: str) -> GatewaySample:
    """Requests per tenant, TPOT buckets per tier and the workers' pools from the gateway's exposition text."""
    requests: dict[str, float] = defaultdict(float)
    buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    pools: dict[str, str] = {}
    for name, labels, value in exposition_samples(text):
        if name == f"{gm.REQUESTS}_total":
            requests[labels.get("tenant", "")] += value
        elif name == f"{gm.TPOT}_bucket":
            buckets[labels.get("tier", "")][float(labels["le"])] += value
        elif name == gm.WORKER_POOL and value >= 1:
            pools[labels.get("worker", "")] = labels.get("pool", "")
    return GatewaySample(dict(requests), {tier: dict(b) for tier, b in buckets.items()}, pools)


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus's ``histogram_quantile`` over cumulative bucket counts (le → count); None without data."""
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def _rate(new: float, old: float, seconds: float) -> float | None:
    """Per-second increase; a counter reset (new < old) counts from zero, as Prometheus does."""
    if seconds <= 0:
        return None
    return (new - old if new >= old else new) / seconds


def _accepted_length(cur: WorkerScrape, prev: WorkerScrape | None) -> float | None:
    """Mean accepted length over the window; None without drafts in it (or after a counter reset)."""
    if prev is None:
        return None
    delta = cur - prev
    return delta.tokens_per_draft if delta.drafts > 0 else None


def _known(k: int) -> int | None:
    """The controller publishes -1 for a k it does not know yet."""
    return k if k >= 0 else None


def worker_row(cur: WorkerSample, prev: WorkerSample | None, seconds: float, *, pool: str | None = None) -> WorkerRow:
    scrape, state = cur.scrape, cur.state
    old = prev.scrape if prev is not None else None
    status = "down" if scrape is None else "unhealthy" if cur.healthy is False else "ok"
    if state is not None and state.stale:
        status = "stale"
    mode = cur.mode
    if mode is not None and mode.phase in (Phase.DRAINING, Phase.RESTARTING):
        status = mode.phase.value  # out of service on purpose, whatever its metrics say
    observed_length = _accepted_length(scrape, old) if scrape is not None else None
    return WorkerRow(
        worker_id=cur.worker_id,
        model=cur.model,
        k_desired=_known(state.k_desired) if state is not None else None,
        k_applied=_known(state.k_applied) if state is not None else (scrape.spec_k if scrape is not None else None),
        accepted_length=state.accepted_length if state is not None else observed_length,
        running=scrape.running if scrape is not None else (state.running if state else None),
        waiting=scrape.waiting if scrape is not None else (state.waiting if state else None),
        kv_usage=scrape.kv_usage if scrape is not None else (state.kv_usage if state else None),
        tokens_per_s=_rate(scrape.generation_tokens, old.generation_tokens, seconds) if scrape and old else None,
        usd_per_mtok=state.usd_per_mtok if state is not None else None,
        reason=state.reason if state is not None else "",
        status=status,
        pool=pool,
        drafter_free=mode is not None and mode.mode is Mode.DRAFTER_FREE,
    )


def worker_rows(prev: Snapshot, cur: Snapshot, fleet: FleetConfig) -> list[WorkerRow]:
    """One row per fleet worker, in fleet order."""
    seconds = cur.at_s - prev.at_s
    rows = []
    for worker in fleet.workers:
        sample = cur.workers.get(worker.id) or WorkerSample(worker.id, worker.model)
        pool = cur.gateway.pools.get(worker.id) if cur.gateway is not None else None
        rows.append(worker_row(sample, prev.workers.get(worker.id), seconds, pool=pool))
    return rows


def _bucket_delta(cur: Mapping[float, float], prev: Mapping[float, float]) -> dict[float, float]:
    return {le: count - prev.get(le, 0.0) for le, count in cur.items()}


def tenant_rows(prev: Snapshot, cur: Snapshot, tenants: TenantsConfig, label: TenantLabeler = PLAIN) -> list[TenantRow]:
    """One row per tenant: its request rate, and its tier's TPOT p99 against the tier's target. ``label``: the
    gateway's ``tenant`` label of a tenant id (its id, or its hash under ``GEARSHIFT_METRICS_TENANT_LABEL=hash``)."""
    seconds = cur.at_s - prev.at_s
    old, new = prev.gateway or GatewaySample(), cur.gateway or GatewaySample()
    rows = []
    for tenant in tenants.tenants:
        tier = tenants.tiers[tenant.tier]
        requests = None
        if cur.gateway is not None and prev.gateway is not None:
            name = label(tenant.id)
            requests = _rate(new.requests.get(name, 0.0), old.requests.get(name, 0.0), seconds)
        delta = _bucket_delta(new.tpot_buckets.get(tenant.tier, {}), old.tpot_buckets.get(tenant.tier, {}))
        rows.append(TenantRow(tenant.id, tenant.tier, requests, histogram_quantile(0.99, delta), tier.tpot_target_s))
    return rows
