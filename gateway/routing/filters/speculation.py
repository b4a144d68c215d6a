"""Speculation per tier and per request (issue 25): which workers may serve a request, by how they speculate.

A request's *speculation mode* (``fleet.config.SpeculationMode``) is its ``x-gearshift-speculation`` header when
its tenant's policy lets it send that value (``TenantConfig.speculation_header``), else its tier's
``speculation``. A header the tenant may not send, or a value that is not a mode, is refused with a 400 that
names the header (``request_speculation``), before admission.

``SpeculationFilter`` then keeps, for a request in mode

- ``auto``: every worker;
- ``off``: the workers that decode without drafts: the ones started without a drafter (their mode record,
  ``fleet.worker_mode``, says ``drafter-free``), and the workers with the plugin's idle-drafter skip
  (``DrafterConfig.idle_skip``) whose pool in the fresh fleet plan is pinned at k = 0 and whose published state
  has applied it (k = 0 there costs no drafter work; a loop never probes such a pool,
  ``controller.placement.obey_pool``). None left: none is kept, and the request gets 503
  ``no_worker_available`` with Retry-After: ``off`` is a promise, not a preference.
- ``fast``: among the workers running their drafter whose published predicted TPOT (``WorkerState``) meets the
  tier's target (every one, for a tier without a target), those at the highest applied k. None qualifies (no
  published state, or every prediction misses the target): every worker is kept and the scorers rank them.

The mode is metered in the ledger (``UsageRecord.speculation``) and counted by the gateway
(``gearshift_gateway_speculation_requests_total``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from fleet.config import SpeculationMode, TenantConfig, TierConfig
from fleet.worker_mode import Mode
from gateway.errors import HeaderNotAllowed
from gateway.routing.context import RouteContext
from gateway.routing.pool import WorkerView

SPECULATION_HEADER: Final = b"x-gearshift-speculation"
"""Request header choosing the request's speculation mode (``auto``, ``off`` or ``fast``)."""
_HEADER_NAME: Final = SPECULATION_HEADER.decode()
_MODES: Final = {m.value: m for m in SpeculationMode}


def request_speculation(header: str | None, tenant: TenantConfig, tier: TierConfig) -> SpeculationMode:
    """The request's speculation mode: its header's when ``tenant`` may send that value, the tier's without a
    header. A value that is not a mode, or one the tenant may not send, is refused (400 naming the header)."""
    if header is None:
        return tier.speculation
    mode = _MODES.get(header.strip().lower())
    allowed = ", ".join(m.value for m in tenant.speculation_header) or "none"
    if mode is None:
        message = f"'{_HEADER_NAME}' must be one of {', '.join(_MODES)}; got {header[:80]!r}."
        raise HeaderNotAllowed(message, param=_HEADER_NAME)
    if mode not in tenant.speculation_header:
        message = (
            f"Tenant '{tenant.id}' may not send the '{_HEADER_NAME}' header with '{mode.value}' "
            f"(its policy allows: {allowed})."
        )
        raise HeaderNotAllowed(message, param=_HEADER_NAME)
    return mode


def serves_without_drafts(worker: WorkerView) -> bool:
    """``worker`` was started without a drafter: its mode record says so (during a move, the mode it leaves)."""
    return worker.mode is not None and worker.mode.mode is Mode.DRAFTER_FREE


def pinned_free_k0(ctx: RouteContext, worker: WorkerView) -> bool:
    """``worker`` skips its idle drafter and runs k = 0 as its fresh plan pool's fixed gear, applied."""
    if not worker.config.drafter.idle_skip or worker.state is None or worker.state.k_applied != 0:
        return False
    plan = ctx.plan
    pool = plan.pool_of_worker(worker.id) if plan is not None and plan.fresh(ctx.now) else None
    return pool is not None and pool.k == 0


def fastest_within_target(ctx: RouteContext, workers: Sequence[WorkerView]) -> list[WorkerView]:
    """The drafter workers at the highest applied k whose predicted TPOT meets ``ctx.tier``'s target (every one
    without a target); empty when none has published state that qualifies."""
    target = ctx.tier.tpot_target_s
    meeting = [
        w
        for w in workers
        if (st := w.state) is not None
        and st.k_applied > 0
        and not serves_without_drafts(w)
        and (target is None or (st.tpot_predicted_s is not None and st.tpot_predicted_s <= target))
    ]
    top = max((w.state.k_applied for w in meeting if w.state is not None), default=0)
    return [w for w in meeting if w.state is not None and w.state.k_applied == top]


class SpeculationFilter:
    """Keep the workers the request's speculation mode allows (the module docstring's rules)."""

    name = "speculation"

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[WorkerView]:
        mode = ctx.speculation
        if mode is SpeculationMode.OFF:
            return [w for w in workers if serves_without_drafts(w) or pinned_free_k0(ctx, w)]
        if mode is SpeculationMode.FAST:
            return fastest_within_target(ctx, workers) or list(workers)
        return list(workers)
