"""Stage 5, report: the governed action counted and logged, the window's cost (``controller.cost``) and the
worker's gauges exported, and the worker state the gateways route by."""

from __future__ import annotations

import itertools
import logging
import operator

from controller.cost import worker_cost
from controller.metrics import ControllerMetrics
from controller.policy import Decision
from controller.runtime import WorkerRuntime
from controller.stabiliser import Action, ActionKind
from fleet.store.protocol import WorkerState

log = logging.getLogger("gearshift.controller")


def record_action(worker_id: str, action: Action, decision: Decision, metrics: ControllerMetrics) -> None:
    """Log a change of k and count the decision by its action and risk."""
    if action.changed:
        log.info("worker %s: %s → k=%d: %s", worker_id, action.kind, action.k, action.reason)
    metrics.decisions.labels(worker_id, action.kind.value, decision.risk.value).inc()
    # A worker's probe count reads 0 before its first probe (the dashboards' probes panel), not "no data": the table
    # start probes only on evidence, so a short run may have none.
    metrics.decisions.labels(worker_id, ActionKind.PROBE.value, decision.risk.value)


def account(rt: WorkerRuntime, m: ControllerMetrics) -> None:
    """Add the worker's cost since the last scrape, and export its gauges and its window's cost split."""
    wid = rt.config.id
    rt.usd_since_attribution += rt.config.usd_per_second * rt.elapsed_s
    rt.elapsed_s = 0.0
    est, decision = rt.estimate, rt.decision
    if est is None or decision is None:
        return
    if rt.stab is not None:
        m.k_desired.labels(wid).set(rt.stab.k)
    if rt.k_applied is not None:
        m.k_applied.labels(wid).set(rt.k_applied)
    m.decode_batch.labels(wid).set(est.batch)
    m.step_correction.labels(wid).set(est.step_correction)
    m.overloaded.labels(wid).set(1 if decision.overloaded else 0)
    chosen = decision.candidate(rt.stab.k) if rt.stab else None
    if chosen is not None:
        m.tpot_predicted.labels(wid).set(chosen.tpot_s)
    if est.accepted_length is not None:
        m.accepted_length.labels(wid).set(est.accepted_length)
    if est.step_observed_s is not None:
        m.step_observed.labels(wid).set(est.step_observed_s)
    w = rt.window
    current = decision.candidate(w.k) if w is not None else None
    k0 = decision.candidate(0)
    if w is None or current is None or k0 is None:
        return
    m.step_predicted.labels(wid).set(current.step_s)
    rt.cost = worker_cost(usd_per_s=rt.config.usd_per_second, window=w, current=current, k0=k0, off=decision.off)
    rt.savings_usd += rt.cost.savings_usd
    if rt.cost.usd_per_mtok is not None:
        m.usd_per_mtok.labels(wid).set(rt.cost.usd_per_mtok)
    if rt.cost.usd_per_mtok_k0 is not None:
        m.usd_per_mtok_k0.labels(wid).set(rt.cost.usd_per_mtok_k0)
    m.drafter_share.labels(wid).set(rt.cost.drafter_share)
    m.rejected_share.labels(wid).set(rt.cost.rejected_share)
    m.savings.labels(wid).set(rt.savings_usd)


def worker_state(rt: WorkerRuntime, *, updated_at: float) -> WorkerState:
    """What the gateway reads. ``acceptance_per_pos`` holds a_i = P(draft i accepted), unconditional as in
    DESIGN §3.2, so the expected tokens per request-step at k' is 1 + Σ_{i<k'} a_i. ``updated_at``: Unix s."""
    est, decision = rt.estimate, rt.decision
    chosen = decision.candidate(rt.stab.k) if decision is not None and rt.stab is not None else None
    scrape = rt.prev
    return WorkerState(
        worker_id=rt.config.id,
        model=rt.config.model,
        k_desired=rt.k_desired if rt.k_desired is not None else -1,
        k_applied=rt.k_applied if rt.k_applied is not None else -1,
        accepted_length=est.accepted_length or 1.0 if est else 1.0,
        acceptance_per_pos=list(itertools.accumulate(est.conditional, operator.mul)) if est else [],
        tpot_predicted_s=chosen.tpot_s if chosen else None,
        running=scrape.running if scrape else 0.0,
        waiting=scrape.waiting if scrape else 0.0,
        kv_usage=scrape.kv_usage if scrape else 0.0,
        usd_per_mtok=rt.cost.usd_per_mtok if rt.cost else None,
        usd_per_mtok_k0=rt.cost.usd_per_mtok_k0 if rt.cost else None,
        drafter_share=rt.cost.drafter_share if rt.cost else None,
        overloaded=decision.overloaded if decision else False,
        stale=est.stale if est else True,
        reason=rt.action.reason if rt.action else "",
        updated_at=updated_at,
    )
