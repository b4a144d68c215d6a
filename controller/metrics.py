"""The controller's own Prometheus metrics; every name the controller exports is defined here (STYLE 11)."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fleet.metric_labels import PLAIN, TenantLabeler

K_DESIRED: Final = "gearshift_controller_k_desired"
K_APPLIED: Final = "gearshift_controller_k_applied"
DECISIONS: Final = "gearshift_controller_decisions"
ACCEPTED_LENGTH: Final = "gearshift_controller_accepted_length"
STEP_PREDICTED: Final = "gearshift_controller_step_predicted_seconds"
STEP_OBSERVED: Final = "gearshift_controller_step_observed_seconds"
STEP_CORRECTION: Final = "gearshift_controller_step_correction"
TPOT_PREDICTED: Final = "gearshift_controller_tpot_predicted_seconds"
DECODE_BATCH: Final = "gearshift_controller_decode_batch"
OVERLOADED: Final = "gearshift_controller_overloaded"
STALE: Final = "gearshift_controller_worker_stale"
SCRAPE_FAILURES: Final = "gearshift_controller_scrape_failures"
ACTUATION_FAILURES: Final = "gearshift_controller_actuation_failures"
TICK_DURATION: Final = "gearshift_controller_tick_duration_seconds"
TICK_FAILURES: Final = "gearshift_controller_tick_failures"
LEADER: Final = "gearshift_controller_leader"
USD_PER_MTOK: Final = "gearshift_controller_usd_per_mtok"
USD_PER_MTOK_K0: Final = "gearshift_controller_usd_per_mtok_k0"
DRAFTER_SHARE: Final = "gearshift_controller_drafter_share"
REJECTED_SHARE: Final = "gearshift_controller_rejected_draft_share"
SAVINGS_USD: Final = "gearshift_controller_speculation_savings_usd"
TENANT_COST_USD: Final = "gearshift_controller_tenant_cost_usd"
PLAN_VERSION: Final = "gearshift_controller_plan_version"
PLAN_GOODPUT: Final = "gearshift_controller_plan_goodput_predicted_tok_s"
WORKER_POOL: Final = "gearshift_controller_worker_pool"
WORKER_MODE: Final = "gearshift_controller_worker_mode"

ALL_NAMES: Final = (
    K_DESIRED, K_APPLIED, DECISIONS, ACCEPTED_LENGTH, STEP_PREDICTED, STEP_OBSERVED, STEP_CORRECTION,
    TPOT_PREDICTED, DECODE_BATCH, OVERLOADED, STALE, SCRAPE_FAILURES, ACTUATION_FAILURES, TICK_DURATION,
    TICK_FAILURES, LEADER, USD_PER_MTOK, USD_PER_MTOK_K0, DRAFTER_SHARE, REJECTED_SHARE, SAVINGS_USD,
    TENANT_COST_USD, PLAN_VERSION, PLAN_GOODPUT, WORKER_POOL, WORKER_MODE,
)  # fmt: skip

_W = ["worker"]


class ControllerMetrics:
    """The controller's metric objects on one registry (made per process, never at import)."""

    def __init__(self, registry: CollectorRegistry | None = None, *, tenant_label: TenantLabeler = PLAIN) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.tenant_label = tenant_label
        """The ``tenant`` label of a tenant id (``GEARSHIFT_METRICS_TENANT_LABEL``; the gateway's labels match it)."""
        r = self.registry
        self.k_desired = Gauge(K_DESIRED, "Speculation length k the controller wants per worker.", _W, registry=r)
        self.k_applied = Gauge(K_APPLIED, "Speculation length k the worker reports applied.", _W, registry=r)
        self.decisions = Counter(
            DECISIONS,
            "Stabiliser actions by kind (hold, up, down, fast-down, probe, …) and the risk the policy saw.",
            [*_W, "kind", "risk"],
            registry=r,
        )
        self.accepted_length = Gauge(
            ACCEPTED_LENGTH, "Observed tokens per request-step at the applied k.", _W, registry=r
        )
        self.step_predicted = Gauge(
            STEP_PREDICTED, "Predicted engine step time at the applied k (corrected).", _W, registry=r
        )
        self.step_observed = Gauge(
            STEP_OBSERVED, "Observed mean engine step time over the last busy window.", _W, registry=r
        )
        self.step_correction = Gauge(
            STEP_CORRECTION, "Online correction factor of the profiled step time.", _W, registry=r
        )
        self.tpot_predicted = Gauge(TPOT_PREDICTED, "Predicted TPOT at the desired k.", _W, registry=r)
        self.decode_batch = Gauge(DECODE_BATCH, "Smoothed mean decoding sequences per step.", _W, registry=r)
        self.overloaded = Gauge(OVERLOADED, "1 when no k meets the TPOT target of the worker's tiers.", _W, registry=r)
        self.stale = Gauge(STALE, "1 while the worker's metrics cannot be read.", _W, registry=r)
        self.scrape_failures = Counter(SCRAPE_FAILURES, "Failed metric reads.", _W, registry=r)
        self.actuation_failures = Counter(ACTUATION_FAILURES, "Failed speculation PUT/GET calls.", _W, registry=r)
        self.tick_duration = Histogram(TICK_DURATION, "Duration of one controller tick.", registry=r)
        self.tick_failures = Counter(TICK_FAILURES, "Ticks that raised and were retried after a back-off.", registry=r)
        self.leader = Gauge(LEADER, "1 while this controller holds the leader lease.", registry=r)
        self.usd_per_mtok = Gauge(
            USD_PER_MTOK, "Cost per million output tokens, USD (idle time included).", _W, registry=r
        )
        self.usd_per_mtok_k0 = Gauge(
            USD_PER_MTOK_K0, "Modelled cost per million output tokens at k=0, USD.", _W, registry=r
        )
        self.drafter_share = Gauge(DRAFTER_SHARE, "Share of step time spent in the drafter.", _W, registry=r)
        self.rejected_share = Gauge(REJECTED_SHARE, "Share of step time verifying rejected drafts.", _W, registry=r)
        self.savings = Gauge(
            SAVINGS_USD, "Cumulative modelled savings of speculation vs k=0, USD (< 0: it cost).", _W, registry=r
        )
        self.tenant_cost = Counter(TENANT_COST_USD, "Cost attributed to each tenant, USD.", ["tenant"], registry=r)
        self.plan_version = Gauge(PLAN_VERSION, "Version of the fleet plan published per model.", ["model"], registry=r)
        self.plan_goodput = Gauge(
            PLAN_GOODPUT, "Goodput the published fleet plan predicts, tokens/s.", ["model"], registry=r
        )
        self.worker_pool = Gauge(
            WORKER_POOL, "1 for the pool each worker is in under the published fleet plan.", [*_W, "pool"], registry=r
        )
        self.worker_mode = Gauge(
            WORKER_MODE,
            "1 for each worker's drafter-free gear record: its mode (drafter, drafter-free) and phase (serving, "
            "draining, restarting, returning).",
            [*_W, "mode", "phase"],
            registry=r,
        )
