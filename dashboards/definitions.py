"""The four gearshift dashboards: fleet overview, speculation control, cost, tenants and SLA.

Every query names only metrics that gearshift's code exports (``fleet.vllm_metrics`` for vLLM's names,
``gateway.metrics``, ``controller.metrics``) or that ``deploy/prometheus/rules`` records; a test checks it.
Worker series carry a ``worker`` label set by the scrape config (the worker's id in the fleet file), the same
label the gateway and the controller put on their per-worker series.
"""

from __future__ import annotations

from dashboards.model import Dashboard, Panel, Query, Row, Variable
from fleet.config import TenantsConfig

RI = "$__rate_interval"
W = 'worker=~"$worker"'
T = 'tenant=~"$tenant"'
TIER = 'tier=~"$tier"'
PROBE = 'kind="probe"'
COMPLETION = 'kind="completion"'
NOT_OK = 'status!="ok"'
SAVINGS_RATE = f"deriv(gearshift_controller_speculation_savings_usd{{{W}}}[{RI}])"
"""USD per second of modelled speculation savings, per series (the savings figure is a cumulative gauge)."""

WORKER_VAR = Variable("worker", "Worker", "label_values(vllm:num_requests_running, worker)")
TENANT_VAR = Variable("tenant", "Tenant", "label_values(gearshift_gateway_requests_total, tenant)")
TIER_VAR = Variable("tier", "Tier", "label_values(gearshift_gateway_time_per_output_token_seconds_count, tier)")

UIDS = ("gearshift-fleet", "gearshift-speculation", "gearshift-cost", "gearshift-tenants")


def sel(*matchers: str) -> str:
    """Label matchers joined into one selector body."""
    return ", ".join(matchers)


def rate_by(metric: str, by: str, selector: str = "", window: str = RI) -> str:
    """``sum by (<by>) (rate(<metric>{<selector>}[<window>]))``."""
    return f"sum by ({by}) (rate({metric}{{{selector}}}[{window}]))"


def quantile(q: float, histogram: str, by: str, selector: str = "") -> str:
    """The ``q`` quantile of a histogram family, per ``by``, over the rate interval."""
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({histogram}_bucket{{{selector}}}[{RI}])))"


def quantile_panel(title: str, histogram: str, by: str, selector: str, description: str) -> Panel:
    queries = tuple(Query(quantile(q, histogram, by, selector), f"{{{{{by}}}}} p{int(q * 100)}") for q in (0.5, 0.99))
    return Panel(title, queries, unit="s", description=description)


def accepted_length(selector: str = W) -> str:
    """Mean tokens per sequence per step: 1 + accepted / drafts (DESIGN §3.2)."""
    accepted = rate_by("vllm:spec_decode_num_accepted_tokens_total", "worker", selector)
    drafts = rate_by("vllm:spec_decode_num_drafts_total", "worker", selector)
    return f"1 + {accepted} / {drafts}"


# ------------------------------------------------------------------------------------------ fleet overview
def fleet_overview() -> Dashboard:
    items: tuple[Panel | Row, ...] = (
        Row("Now"),
        Panel("Requests/s", (Query(f"sum(rate(gearshift_gateway_requests_total[{RI}]))"),), "reqps", "stat", width=6),
        Panel(
            "Output tokens/s (engines)",
            (Query(f"sum(rate(vllm:generation_tokens_total[{RI}]))"),),
            "short",
            "stat",
            width=6,
        ),
        Panel(
            "Error ratio",
            (
                Query(
                    f"sum(rate(gearshift_gateway_requests_total{{{NOT_OK}}}[{RI}])) "
                    f"/ sum(rate(gearshift_gateway_requests_total[{RI}]))"
                ),
            ),
            "percentunit",
            "stat",
            width=6,
            thresholds=((0.01, "orange"), (0.05, "red")),
        ),
        Panel(
            "Healthy workers",
            (Query("count(max by (worker) (gearshift_gateway_worker_healthy) == 1)"),),
            "short",
            "stat",
            width=6,
        ),
        Row("Traffic"),
        Panel(
            "Requests/s by status",
            (Query(rate_by("gearshift_gateway_requests_total", "status", T), "{{status}}"),),
            "reqps",
            stacked=True,
        ),
        Panel(
            "Errors/s by type",
            (Query(rate_by("gearshift_gateway_errors_total", "type"), "{{type}}"),),
            "reqps",
            stacked=True,
            description="Errors returned to clients (as a response or mid-stream), by the error's OpenAI type, "
            "e.g. insufficient_quota for a spent budget.",
        ),
        Panel(
            "Output tokens/s per worker (engine)",
            (Query(rate_by("vllm:generation_tokens_total", "worker", W), "{{worker}}"),),
            stacked=True,
        ),
        Panel(
            "Tokens/s metered at the gateway",
            (Query(rate_by("gearshift_gateway_tokens_total", "kind", T), "{{kind}}"),),
            stacked=True,
        ),
        Row("Latency per tier (at the gateway)"),
        quantile_panel(
            "Time to first token",
            "gearshift_gateway_time_to_first_token_seconds",
            "tier",
            TIER,
            "p50 and p99 per SLA tier, measured at the gateway (queueing and prefill included).",
        ),
        quantile_panel(
            "Time per output token",
            "gearshift_gateway_time_per_output_token_seconds",
            "tier",
            TIER,
            "p50 and p99 per SLA tier of each request's mean time per output token after the first.",
        ),
        quantile_panel(
            "Request duration",
            "gearshift_gateway_request_duration_seconds",
            "tier",
            TIER,
            "End-to-end duration at the gateway.",
        ),
        quantile_panel(
            "Time to first token per worker (engine)",
            "vllm:time_to_first_token_seconds",
            "worker",
            W,
            "The engine's own view, without the gateway hop.",
        ),
        Row("Overload control (gateway queue)"),
        Panel(
            "Queued requests per priority band",
            (Query("sum by (model, band) (gearshift_gateway_queue_depth)", "{{model}} band {{band}}"),),
            stacked=True,
            description="Requests waiting in the gateways' overload queues for a worker with headroom, per model "
            "and tier priority (lower bands are served first).",
        ),
        quantile_panel(
            "Queued time",
            "gearshift_gateway_queued_seconds",
            "tier",
            TIER,
            "p50 and p99 per tier of the time a queued request waited (dispatched or refused).",
        ),
        Panel(
            "Shed requests/s by tier and reason",
            (Query(rate_by("gearshift_gateway_shed_requests_total", "tier, reason", TIER), "{{tier}} {{reason}}"),),
            "reqps",
            stacked=True,
            description="Refused by the overload control: 429 for a sheddable tier, 503 for one that waited its "
            "TTFT target (reasons in gateway/overload.py).",
        ),
        Panel(
            "Brownout",
            (Query("max(gearshift_gateway_brownout)", "brownout"),),
            description="1 while any gateway replica caps new requests' max_tokens to their tier's "
            "brownout_max_tokens.",
        ),
        Row("Workers"),
        Panel(
            "Running and waiting requests",
            (
                Query(f"sum by (worker) (vllm:num_requests_running{{{W}}})", "{{worker}} running"),
                Query(f"sum by (worker) (vllm:num_requests_waiting{{{W}}})", "{{worker}} waiting"),
            ),
        ),
        Panel(
            "KV cache usage",
            (Query(f"max by (worker) (vllm:kv_cache_usage_perc{{{W}}})", "{{worker}}"),),
            "percentunit",
        ),
        Panel(
            "In-flight requests per worker (gateway)",
            (Query(f"sum by (worker) (gearshift_gateway_in_flight_requests{{{W}}})", "{{worker}}"),),
            stacked=True,
        ),
        Panel(
            "Worker health seen by the gateways",
            (Query(f"min by (worker) (gearshift_gateway_worker_healthy{{{W}}})", "{{worker}}"),),
            description="1 when every gateway replica's last health probe of the worker passed.",
        ),
        Panel(
            "Upstream retries and ejections",
            (
                Query(
                    rate_by("gearshift_gateway_upstream_retries_total", "worker, cause", W),
                    "retry {{worker}} {{cause}}",
                ),
                Query(rate_by("gearshift_gateway_worker_ejections_total", "worker", W), "ejected {{worker}}"),
            ),
            "ops",
        ),
        Panel(
            "Preemptions/s",
            (Query(rate_by("vllm:num_preemptions_total", "worker", W), "{{worker}}"),),
            "ops",
        ),
    )
    return Dashboard(
        uid=UIDS[0],
        title="gearshift / Fleet overview",
        description="Requests, tokens, errors and latency per SLA tier across the gateway replicas and workers.",
        items=items,
        variables=(WORKER_VAR, TENANT_VAR, TIER_VAR),
        links=UIDS[1:],
    )


# -------------------------------------------------------------------------------------- speculation control
def speculation_control() -> Dashboard:
    items: tuple[Panel | Row, ...] = (
        Row("Speculation length"),
        Panel(
            "Desired vs applied k",
            (
                Query(f"max by (worker) (gearshift_controller_k_desired{{{W}}})", "{{worker}} desired"),
                Query(f"max by (worker) (gearshift_controller_k_applied{{{W}}})", "{{worker}} applied"),
            ),
            description="What the leader controller wants and what the worker reported as applied.",
        ),
        Panel(
            "Applied k per worker (worker's schedule)",
            (
                Query(
                    f"max by (worker, from_bs, to_bs) (gearshift_worker_spec_k{{{W}}})",
                    "{{worker}} bs {{from_bs}}-{{to_bs}}",
                ),
            ),
            description="Each row of the worker's batch-size → k schedule, as the worker itself reports it.",
        ),
        Panel(
            "Controller decisions/min by kind",
            (
                Query(
                    f"60 * {rate_by('gearshift_controller_decisions_total', 'worker, kind', W)}", "{{worker}} {{kind}}"
                ),
            ),
            stacked=True,
            description="Stabiliser actions: hold, up, down, fast-down, probe, probe-end, stale-default, plan "
            "(the fleet plan's pool gear). The "
            "reason string of the latest decision is in `gearshift top` and `gearshift controller explain`.",
        ),
        Panel(
            "Probes and lease expiries (per hour)",
            (
                Query(
                    f"3600 * {rate_by('gearshift_controller_decisions_total', 'worker', sel(W, PROBE))}",
                    "{{worker}} probes",
                ),
                Query(
                    f"3600 * {rate_by('gearshift_worker_spec_lease_expired_total', 'worker', W)}",
                    "{{worker}} lease expired",
                ),
            ),
            description="Probes at k_max observe positions above the current k; a lease expiry means the "
            "controller did not renew a schedule and the worker fell back to its start-up table.",
        ),
        Row("Drafter-free gear"),
        Panel(
            "Mode, phase and gear per worker",
            (
                Query(
                    f"max by (worker, mode, phase) (gearshift_controller_worker_mode{{{W}}}) * on (worker) group_left "
                    f"max by (worker) (gearshift_controller_k_desired{{{W}}})",
                    "{{worker}} {{mode}} {{phase}}",
                ),
            ),
            description="Each worker's drafter-free gear record (the legend: drafter or drafter-free; serving, "
            "draining, restarting or returning) and the k it runs (the value). A draining worker gets no new "
            "requests; a restarting one serves nothing for the profile's restart_s. Set by the leader controller "
            "(GEARSHIFT_DRAFTER_FREE__ENABLED).",
        ),
        Row("Fleet placement"),
        Panel(
            "Pool and gear per worker",
            (
                Query(
                    f"max by (worker, pool) (gearshift_controller_worker_pool{{{W}}}) * on (worker) group_left "
                    f"max by (worker) (gearshift_controller_k_desired{{{W}}})",
                    "{{worker}} in {{pool}}",
                ),
            ),
            width=8,
            description="Each worker's pool in the published fleet plan (the legend) and the k it runs there (the "
            "value). A worker missing here is in no plan: its own loop chooses its k.",
        ),
        Panel(
            "Fleet plan",
            (
                Query("max by (model) (gearshift_controller_plan_version)", "{{model}} version"),
                Query("min by (model) (gearshift_gateway_plan_fresh)", "{{model}} fresh at every gateway"),
            ),
            width=8,
            description="The plan's version grows when the planner changes the pools; a gateway that reads it "
            "older than its TTL routes on load alone (fresh 0).",
        ),
        Panel(
            "Placement routing (req/s by outcome)",
            (Query(rate_by("gearshift_gateway_placement_routes_total", "outcome"), "{{outcome}}"),),
            "reqps",
            width=8,
            stacked=True,
            description="home: the class's own pool; spill: another pool within its SLA headroom; saturated: "
            "every candidate at its cap (the request waits); unplanned: no fresh plan or no pool for the class.",
        ),
        Row("Acceptance"),
        Panel(
            "Accepted length (tokens per sequence per step)",
            (
                Query(accepted_length(), "{{worker}} observed"),
                Query(
                    f"max by (worker) (gearshift_controller_accepted_length{{{W}}})", "{{worker}} controller estimate"
                ),
            ),
            decimals=2,
        ),
        Panel(
            "Acceptance per draft position",
            (
                Query(
                    f"{rate_by('vllm:spec_decode_num_accepted_tokens_per_pos_total', 'worker, position', W)} "
                    f"/ ignoring (position) group_left "
                    f"{rate_by('vllm:spec_decode_num_drafts_total', 'worker', W)}",
                    "{{worker}} pos {{position}}",
                ),
            ),
            "percentunit",
            description="a_i = accepted at position i / drafts. Positions above the applied k read zero.",
        ),
        Panel(
            "Draft-token acceptance rate",
            (
                Query(
                    f"{rate_by('vllm:spec_decode_num_accepted_tokens_total', 'worker', W)} "
                    f"/ {rate_by('vllm:spec_decode_num_draft_tokens_total', 'worker', W)}",
                    "{{worker}}",
                ),
            ),
            "percentunit",
        ),
        Panel(
            "Output tokens per engine step",
            (
                Query(
                    f"{rate_by('vllm:generation_tokens_total', 'worker', W)} "
                    f"/ {rate_by('vllm:iteration_tokens_total_count', 'worker', W)}",
                    "{{worker}}",
                ),
            ),
            decimals=2,
        ),
        Row("Model and loop health"),
        Panel(
            "Step time: predicted vs observed",
            (
                Query(f"max by (worker) (gearshift_controller_step_predicted_seconds{{{W}}})", "{{worker}} predicted"),
                Query(f"max by (worker) (gearshift_controller_step_observed_seconds{{{W}}})", "{{worker}} observed"),
            ),
            "s",
        ),
        Panel(
            "TPOT: controller prediction vs engine p50",
            (
                Query(f"max by (worker) (gearshift_controller_tpot_predicted_seconds{{{W}}})", "{{worker}} predicted"),
                Query(quantile(0.5, "vllm:request_time_per_output_token_seconds", "worker", W), "{{worker}} p50"),
            ),
            "s",
        ),
        Panel(
            "Smoothed decode batch",
            (Query(f"max by (worker) (gearshift_controller_decode_batch{{{W}}})", "{{worker}}"),),
        ),
        Panel(
            "Overloaded and stale workers",
            (
                Query(f"max by (worker) (gearshift_controller_overloaded{{{W}}})", "{{worker}} overloaded"),
                Query(f"max by (worker) (gearshift_controller_worker_stale{{{W}}})", "{{worker}} stale"),
            ),
        ),
        Panel(
            "Controller: leader, tick p99, failures",
            (
                Query("sum(gearshift_controller_leader)", "leaders"),
                Query(
                    f"histogram_quantile(0.99, sum by (le) "
                    f"(rate(gearshift_controller_tick_duration_seconds_bucket[{RI}])))",
                    "tick p99 (s)",
                ),
                Query(f"sum(rate(gearshift_controller_tick_failures_total[{RI}]))", "tick failures/s"),
                Query(
                    rate_by("gearshift_controller_actuation_failures_total", "worker", W),
                    "{{worker}} actuation failures/s",
                ),
                Query(
                    rate_by("gearshift_controller_scrape_failures_total", "worker", W), "{{worker}} scrape failures/s"
                ),
            ),
            width=24,
        ),
    )
    return Dashboard(
        uid=UIDS[1],
        title="gearshift / Speculation control",
        description="Each worker's speculation length over time, why the controller chose it, and the acceptance "
        "it observes.",
        items=items,
        variables=(WORKER_VAR,),
        links=(UIDS[0], *UIDS[2:]),
    )


# ------------------------------------------------------------------------------------------------------ cost
def cost() -> Dashboard:
    spend_per_worker = (
        "max by (worker) (gearshift_controller_usd_per_mtok) * on (worker) "
        f"sum by (worker) (rate(vllm:generation_tokens_total[{RI}])) * 3600 / 1e6"
    )
    items: tuple[Panel | Row, ...] = (
        Row("Fleet"),
        Panel(
            "Fleet $/Mtok (metered)",
            (
                Query(
                    f"sum(rate(gearshift_gateway_cost_usd_total[{RI}])) "
                    f"/ sum(rate(gearshift_gateway_tokens_total{{{COMPLETION}}}[{RI}])) * 1e6"
                ),
            ),
            "currencyUSD",
            "stat",
            width=8,
            decimals=2,
        ),
        Panel("Fleet spend rate, USD/h", (Query(f"sum({spend_per_worker})"),), "currencyUSD", "stat", width=8),
        Panel(
            "Speculation savings, USD/h",
            (Query(f"3600 * sum({SAVINGS_RATE})"),),
            "currencyUSD",
            "stat",
            width=8,
            description="Modelled cost at k=0 for the same load minus the actual cost, per hour (negative: "
            "speculation cost more than it saved).",
        ),
        Row("Per worker"),
        Panel(
            "$/Mtok per worker: actual vs k=0",
            (
                Query(f"max by (worker) (gearshift_controller_usd_per_mtok{{{W}}})", "{{worker}} actual"),
                Query(f"max by (worker) (gearshift_controller_usd_per_mtok_k0{{{W}}})", "{{worker}} at k=0"),
            ),
            "currencyUSD",
            description="Output-token cost including the drafter and rejected drafts (idle time included), and "
            "the modelled counterfactual without speculation.",
        ),
        Panel(
            "Drafter and wasted-draft share of step time",
            (
                Query(f"max by (worker) (gearshift_controller_drafter_share{{{W}}})", "{{worker}} drafter"),
                Query(
                    f"max by (worker) (gearshift_controller_rejected_draft_share{{{W}}})", "{{worker}} rejected drafts"
                ),
            ),
            "percentunit",
        ),
        Panel(
            "Speculation savings per worker",
            (
                Query(f"3600 * sum by (worker) ({SAVINGS_RATE})", "{{worker}} USD/h"),
                Query(
                    f"max by (worker) (gearshift_controller_speculation_savings_usd{{{W}}})",
                    "{{worker}} cumulative USD",
                ),
            ),
            "currencyUSD",
            description="The controller's cumulative modelled savings (a gauge: it falls when speculation costs "
            "more than it saves) and its rate of change.",
        ),
        Panel(
            "Spend rate per worker, USD/h",
            (Query(spend_per_worker, "{{worker}}"),),
            "currencyUSD",
            stacked=True,
        ),
        Row("Per tenant"),
        Panel(
            "$/Mtok per tenant (metered)",
            (
                Query(
                    f"{rate_by('gearshift_gateway_cost_usd_total', 'tenant', T)} "
                    f"/ {rate_by('gearshift_gateway_tokens_total', 'tenant', sel(T, COMPLETION))}"
                    " * 1e6",
                    "{{tenant}}",
                ),
            ),
            "currencyUSD",
        ),
        Panel(
            "Spend per tenant, USD/h: metered vs attributed",
            (
                Query(f"3600 * {rate_by('gearshift_gateway_cost_usd_total', 'tenant', T)}", "{{tenant}} metered"),
                Query(
                    f"3600 * {rate_by('gearshift_controller_tenant_cost_usd_total', 'tenant', T)}",
                    "{{tenant}} attributed",
                ),
            ),
            "currencyUSD",
            description="Metered: per request at the gateway from the worker's published cost per token. "
            "Attributed: the controller's split of each worker's cost by the work the tenant's requests caused.",
        ),
    )
    return Dashboard(
        uid=UIDS[2],
        title="gearshift / Cost",
        description="Honest cost per token: drafter overhead and rejected drafts included, per worker and tenant.",
        items=items,
        variables=(WORKER_VAR, TENANT_VAR),
        links=(*UIDS[:2], UIDS[3]),
    )


# ---------------------------------------------------------------------------------------------- tenants & SLA
def tenants_and_sla(tenants: TenantsConfig) -> Dashboard:
    targets = tuple(
        Query(f"vector({tier.tpot_target_s})", f"{name} target")
        for name, tier in sorted(tenants.tiers.items())
        if tier.tpot_target_s is not None
    )
    items: tuple[Panel | Row, ...] = (
        Row("SLA per tier"),
        Panel(
            "SLA attainment (share of requests within target, 5m)",
            (Query(f"gearshift:tier_sla_good:ratio_rate5m{{{TIER}}}", "{{tier}} {{slo}}"),),
            "percentunit",
            description="Recorded by deploy/prometheus/rules/gearshift-sla.rules.yml from each tier's targets.",
        ),
        Panel(
            "Error-budget burn rate (1h)",
            (Query(f"gearshift:tier_sla_burn:rate1h{{{TIER}}}", "{{tier}} {{slo}}"),),
            thresholds=((6.0, "orange"), (14.4, "red")),
            description="1 spends the error budget exactly over the SLO period; 14.4 pages, 6 opens a ticket.",
        ),
        Panel(
            "TPOT p99 per tier vs target",
            (
                Query(quantile(0.99, "gearshift_gateway_time_per_output_token_seconds", "tier", TIER), "{{tier}} p99"),
                *targets,
            ),
            "s",
        ),
        Panel(
            "Error ratio per tenant",
            (
                Query(
                    f"{rate_by('gearshift_gateway_requests_total', 'tenant', sel(T, NOT_OK))} "
                    f"/ {rate_by('gearshift_gateway_requests_total', 'tenant', T)}",
                    "{{tenant}}",
                ),
            ),
            "percentunit",
        ),
        Row("Usage and limits"),
        Panel(
            "Requests/s per tenant",
            (Query(rate_by("gearshift_gateway_requests_total", "tenant", T), "{{tenant}}"),),
            "reqps",
            stacked=True,
        ),
        Panel(
            "Tokens/s per tenant",
            (Query(rate_by("gearshift_gateway_tokens_total", "tenant, kind", T), "{{tenant}} {{kind}}"),),
            stacked=True,
        ),
        Panel(
            "Limits hit (rejections/s)",
            (
                Query(
                    rate_by("gearshift_gateway_admission_rejections_total", "tenant, reason", T),
                    "{{tenant}} {{reason}}",
                ),
            ),
            "reqps",
            stacked=True,
            description="429s by the limit that tripped: requests/min, tokens/min, concurrency, budget.",
        ),
        Panel(
            "Budget burn: spend over the selected range, USD",
            (
                Query(
                    f"sum by (tenant) (increase(gearshift_gateway_cost_usd_total{{{T}}}[$__range]))", "{{tenant}}", True
                ),
            ),
            "currencyUSD",
            "bargauge",
        ),
        Panel(
            "Spend rate per tenant, USD/day",
            (Query(f"86400 * {rate_by('gearshift_gateway_cost_usd_total', 'tenant', T, '1h')}", "{{tenant}}"),),
            "currencyUSD",
            width=24,
        ),
    )
    return Dashboard(
        uid=UIDS[3],
        title="gearshift / Tenants and SLA",
        description="Per-tenant usage, limits and spend; per-tier SLA attainment and error-budget burn.",
        items=items,
        variables=(TENANT_VAR, TIER_VAR),
        links=UIDS[:3],
    )


def all_dashboards(tenants: TenantsConfig) -> tuple[Dashboard, ...]:
    return fleet_overview(), speculation_control(), cost(), tenants_and_sla(tenants)
