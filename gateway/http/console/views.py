"""What the console's pages show, computed from what the admin API returns: pure functions, no I/O.

Latency and cost figures come from the usage ledger over a recent window (each record is one request as the
gateway metered it); the drafter's share and the k = 0 counterfactual come from the worker states the
controller publishes, weighted by each request's cost on its worker.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fleet.config import TierConfig
from fleet.plan import FleetPlan
from fleet.store.protocol import UsageRecord, WorkerState
from fleet.worker_mode import WorkerMode


def quantile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0 < q ≤ 1) of ``values``; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def per_mtok(cost_usd: float, tokens: int) -> float | None:
    """USD per million tokens; None without tokens."""
    return cost_usd / tokens * 1e6 if tokens else None


@dataclass(frozen=True, slots=True)
class FleetRow:
    worker_id: str
    model: str
    pool: str | None
    mode: str
    """``drafter`` or ``drafter-free`` (unknown: ``drafter``, the start-up mode)."""
    phase: str
    """``serving``, ``draining``, ``restarting`` or ``returning``."""
    healthy: bool
    in_flight: int
    state: WorkerState | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    requests: int
    """Requests in the window that the latencies are over."""


def fleet_rows(
    workers: Iterable[Mapping[str, object]], records: Iterable[UsageRecord], plans: Mapping[str, FleetPlan]
) -> list[FleetRow]:
    """One row per worker of the admin API's ``GET /admin/v1/workers``, with the TPOT quantiles of its recent
    ledger records and its pool in its model's plan."""
    tpots: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)
    for record in records:
        if record.worker_id is None:
            continue
        counts[record.worker_id] += 1
        if record.tpot_s is not None:
            tpots[record.worker_id].append(record.tpot_s)
    rows = []
    for worker in workers:
        wid, model = str(worker["id"]), str(worker["model"])
        state = WorkerState.model_validate(worker["state"]) if worker.get("state") else None
        mode = WorkerMode.model_validate(worker["mode"]) if worker.get("mode") else None
        plan = plans.get(model)
        pool = plan.pool_of_worker(wid) if plan is not None else None
        rows.append(
            FleetRow(
                worker_id=wid,
                model=model,
                pool=pool.name if pool is not None else None,
                mode=mode.mode.value if mode else "drafter",
                phase=mode.phase.value if mode else "serving",
                healthy=bool(worker.get("healthy")),
                in_flight=int(str(worker.get("in_flight") or 0)),
                state=state,
                tpot_p50_s=quantile(tpots[wid], 0.5),
                tpot_p99_s=quantile(tpots[wid], 0.99),
                requests=counts[wid],
            )
        )
    return rows


def usage_series(records: Iterable[UsageRecord], *, since: float, until: float, buckets: int) -> list[float]:
    """Spend (USD) per bucket of ``[since, until)`` cut into ``buckets`` equal parts, oldest first."""
    width = (until - since) / buckets
    series = [0.0] * buckets
    for record in records:
        if since <= record.at < until:
            series[min(int((record.at - since) / width), buckets - 1)] += record.cost_usd
    return series


def sparkline(values: Sequence[float], *, width: int = 160, height: int = 32) -> str:
    """An SVG polyline's ``points`` for ``values`` scaled into ``width`` × ``height`` (higher is up)."""
    if not values:
        return ""
    top = max(values) or 1.0
    step = width / max(len(values) - 1, 1)
    return " ".join(f"{i * step:.1f},{height - v / top * height:.1f}" for i, v in enumerate(values))


@dataclass(frozen=True, slots=True)
class TierRow:
    name: str
    config: TierConfig
    requests: int
    ttft_met: float | None
    """Share of the window's requests with a TTFT within the target (None: no target or no request)."""
    tpot_met: float | None
    changed: bool
    """A run-time change of this tier is in force."""


def _share(values: Sequence[float], target: float | None) -> float | None:
    if target is None or not values:
        return None
    return sum(v <= target for v in values) / len(values)


def tier_rows(
    tiers: Mapping[str, TierConfig], records: Iterable[UsageRecord], *, changed: Iterable[str] = ()
) -> list[TierRow]:
    """Per tier, the share of the window's requests that met its TTFT and TPOT targets."""
    ttft: dict[str, list[float]] = defaultdict(list)
    tpot: dict[str, list[float]] = defaultdict(list)
    count: dict[str, int] = defaultdict(int)
    for record in records:
        if record.tier is None or record.status != "ok":
            continue
        count[record.tier] += 1
        if record.ttft_s is not None:
            ttft[record.tier].append(record.ttft_s)
        if record.tpot_s is not None:
            tpot[record.tier].append(record.tpot_s)
    in_force = set(changed)
    return [
        TierRow(
            name=name,
            config=tier,
            requests=count[name],
            ttft_met=_share(ttft[name], tier.ttft_target_s),
            tpot_met=_share(tpot[name], tier.tpot_target_s),
            changed=name in in_force,
        )
        for name, tier in sorted(tiers.items())
    ]


@dataclass(frozen=True, slots=True)
class CostRow:
    tenant: str
    model: str
    requests: int
    completion_tokens: int
    cost_usd: float
    usd_per_mtok: float | None
    drafter_share: float | None
    """The drafter's share of the cost, weighted by each request's cost on its worker (None: not published)."""
    usd_per_mtok_k0: float | None
    """What the same tokens would have cost at k = 0, by each worker's modelled counterfactual."""


def cost_rows(records: Iterable[UsageRecord], states: Mapping[str, WorkerState]) -> list[CostRow]:
    """$/Mtok per (tenant, model) over the records, with the drafter's share and the k = 0 counterfactual."""
    groups: dict[tuple[str, str], list[UsageRecord]] = defaultdict(list)
    for record in records:
        groups[(record.tenant, record.model)].append(record)
    rows = []
    for (tenant, model), group in sorted(groups.items()):
        cost = sum(r.cost_usd for r in group)
        tokens = sum(r.completion_tokens for r in group)
        shares = [(r.cost_usd, _drafter_share(_state(states, r))) for r in group]
        k0 = [(r, _k0_ratio(_state(states, r))) for r in group]
        rows.append(
            CostRow(
                tenant=tenant,
                model=model,
                requests=len(group),
                completion_tokens=tokens,
                cost_usd=cost,
                usd_per_mtok=per_mtok(cost, tokens),
                drafter_share=_weighted([(c, s) for c, s in shares if s is not None]),
                usd_per_mtok_k0=_counterfactual(k0, tokens),
            )
        )
    return rows


def _state(states: Mapping[str, WorkerState], record: UsageRecord) -> WorkerState | None:
    return states.get(record.worker_id) if record.worker_id is not None else None


def _drafter_share(state: WorkerState | None) -> float | None:
    return state.drafter_share if state is not None and state.usd_per_mtok is not None else None


def _k0_ratio(state: WorkerState | None) -> float | None:
    if state is None or not state.usd_per_mtok or state.usd_per_mtok_k0 is None:
        return None
    return state.usd_per_mtok_k0 / state.usd_per_mtok


def _weighted(pairs: Sequence[tuple[float, float]]) -> float | None:
    total = sum(w for w, _ in pairs)
    return sum(w * v for w, v in pairs) / total if total > 0 else None


def _counterfactual(pairs: Sequence[tuple[UsageRecord, float | None]], tokens: int) -> float | None:
    if not pairs or any(ratio is None for _, ratio in pairs):
        return None
    return per_mtok(sum(r.cost_usd * ratio for r, ratio in pairs if ratio is not None), tokens)
