"""The four gearshift dashboards: fleet overview, speculation control, cost, tenants and SLA.

Every query names only metrics that gearshift's code exports (``fleet.vllm_metrics`` for vLLM's names,
``gateway.metrics``, ``controller.metrics``) or that ``deploy/prometheus/rules`` records; a test checks it.
Worker series carry a ``worker`` label set by the scrape config (the worker's id in the fleet file), the same
label the gateway and the controller put on their per-worker series.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as board
from grafana_foundation_sdk.builders import timeseries

from dashboards.board import Item, dashboard
from dashboards.style import bargauge_panel, label_variable, query, row, stat_panel, timeseries_panel
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


def worker_variable() -> board.QueryVariable:
    return label_variable("worker", "Worker", "label_values(vllm:num_requests_running, worker)")


def tenant_variable() -> board.QueryVariable:
    return label_variable("tenant", "Tenant", "label_values(gearshift_gateway_requests_total, tenant)")


def tier_variable() -> board.QueryVariable:
    return label_variable("tier", "Tier", "label_values(gearshift_gateway_time_per_output_token_seconds_count, tier)")


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


def quantile_panel(title: str, histogram: str, by: str, selector: str, description: str) -> timeseries.Panel:
    queries = tuple(query(quantile(q, histogram, by, selector), f"{{{{{by}}}}} p{int(q * 100)}") for q in (0.5, 0.99))
    return timeseries_panel(title, *queries, unit="s").description(description)


def accepted_length(selector: str = W) -> str:
    """Mean tokens per sequence per step: 1 + accepted / drafts (DESIGN §3.2)."""
    accepted = rate_by("vllm:spec_decode_num_accepted_tokens_total", "worker", selector)
    drafts = rate_by("vllm:spec_decode_num_drafts_total", "worker", selector)
    return f"1 + {accepted} / {drafts}"


# ------------------------------------------------------------------------------------------ fleet overview
def fleet_overview() -> board.Dashboard:
    items: tuple[Item, ...] = (
        row("Now"),
        stat_panel("Requests/s", query(f"sum(rate(gearshift_gateway_requests_total[{RI}]))"), unit="reqps").span(6),
        stat_panel("Output tokens/s (engines)", query(f"sum(rate(vllm:generation_tokens_total[{RI}]))")).span(6),
        stat_panel(
            "Error ratio",
            query(
                f"sum(rate(gearshift_gateway_requests_total{{{NOT_OK}}}[{RI}])) "
                f"/ sum(rate(gearshift_gateway_requests_total[{RI}]))"
            ),
            unit="percentunit",
            thresholds=((0.01, "orange"), (0.05, "red")),
        ).span(6),
        stat_panel("Healthy workers", query("count(max by (worker) (gearshift_gateway_worker_healthy) == 1)")).span(6),
        row("Traffic"),
        timeseries_panel(
            "Requests/s by status",
            query(rate_by("gearshift_gateway_requests_total", "status", T), "{{status}}"),
            unit="reqps",
            stacked=True,
        ),
        timeseries_panel(
            "Errors/s by type",
            query(rate_by("gearshift_gateway_errors_total", "type"), "{{type}}"),
            unit="reqps",
            stacked=True,
        ).description(
            "Errors returned to clients (as a response or mid-stream), by the error's OpenAI type, "
            "e.g. insufficient_quota for a spent budget."
        ),
        timeseries_panel(
            "Output tokens/s per worker (engine)",
            query(rate_by("vllm:generation_tokens_total", "worker", W), "{{worker}}"),
            stacked=True,
        ),
        timeseries_panel(
            "Tokens/s metered at the gateway",
            query(rate_by("gearshift_gateway_tokens_total", "kind", T), "{{kind}}"),
            stacked=True,
        ),
        row("Latency per tier (at the gateway)"),
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
        row("Overload control (gateway queue)"),
        timeseries_panel(
            "Queued requests per priority band",
            query("sum by (model, band) (gearshift_gateway_queue_depth)", "{{model}} band {{band}}"),
            stacked=True,
        ).description(
            "Requests waiting in the gateways' overload queues for a worker with headroom, per model "
            "and tier priority (lower bands are served first)."
        ),
        quantile_panel(
            "Queued time",
            "gearshift_gateway_queued_seconds",
            "tier",
            TIER,
            "p50 and p99 per tier of the time a queued request waited (dispatched or refused).",
        ),
        timeseries_panel(
            "Shed requests/s by tier and reason",
            query(rate_by("gearshift_gateway_shed_requests_total", "tier, reason", TIER), "{{tier}} {{reason}}"),
            unit="reqps",
            stacked=True,
        ).description(
            "Refused by the overload control: 429 for a sheddable tier, 503 for one that waited its "
            "TTFT target (reasons in gateway/overload.py)."
        ),
        timeseries_panel("Brownout", query("max(gearshift_gateway_brownout)", "brownout")).description(
            "1 while any gateway replica caps new requests' max_tokens to their tier's brownout_max_tokens."
        ),
        row("Workers"),
        timeseries_panel(
            "Running and waiting requests",
            query(f"sum by (worker) (vllm:num_requests_running{{{W}}})", "{{worker}} running"),
            query(f"sum by (worker) (vllm:num_requests_waiting{{{W}}})", "{{worker}} waiting"),
        ),
        timeseries_panel(
            "KV cache usage",
            query(f"max by (worker) (vllm:kv_cache_usage_perc{{{W}}})", "{{worker}}"),
            unit="percentunit",
        ),
        timeseries_panel(
            "In-flight requests per worker (gateway)",
            query(f"sum by (worker) (gearshift_gateway_in_flight_requests{{{W}}})", "{{worker}}"),
            stacked=True,
        ),
        timeseries_panel(
            "Worker health seen by the gateways",
            query(f"min by (worker) (gearshift_gateway_worker_healthy{{{W}}})", "{{worker}}"),
        ).description("1 when every gateway replica's last health probe of the worker passed."),
        timeseries_panel(
            "Upstream retries and ejections",
            query(
                rate_by("gearshift_gateway_upstream_retries_total", "worker, cause", W), "retry {{worker}} {{cause}}"
            ),
            query(rate_by("gearshift_gateway_worker_ejections_total", "worker", W), "ejected {{worker}}"),
            unit="ops",
        ),
        timeseries_panel(
            "Preemptions/s", query(rate_by("vllm:num_preemptions_total", "worker", W), "{{worker}}"), unit="ops"
        ),
    )
    return dashboard(
        UIDS[0],
        "gearshift / Fleet overview",
        "Requests, tokens, errors and latency per SLA tier across the gateway replicas and workers.",
        items,
        variables=(worker_variable(), tenant_variable(), tier_variable()),
        links=UIDS[1:],
    )


# -------------------------------------------------------------------------------------- speculation control
def speculation_control() -> board.Dashboard:
    items: tuple[Item, ...] = (
        row("Speculation length"),
        timeseries_panel(
            "Desired vs applied k",
            query(f"max by (worker) (gearshift_controller_k_desired{{{W}}})", "{{worker}} desired"),
            query(f"max by (worker) (gearshift_controller_k_applied{{{W}}})", "{{worker}} applied"),
        ).description("What the leader controller wants and what the worker reported as applied."),
        timeseries_panel(
            "Applied k per worker (worker's schedule)",
            query(
                f"max by (worker, from_bs, to_bs) (gearshift_worker_spec_k{{{W}}})",
                "{{worker}} bs {{from_bs}}-{{to_bs}}",
            ),
        ).description("Each row of the worker's batch-size → k schedule, as the worker itself reports it."),
        timeseries_panel(
            "Controller decisions/min by kind",
            query(f"60 * {rate_by('gearshift_controller_decisions_total', 'worker, kind', W)}", "{{worker}} {{kind}}"),
            stacked=True,
        ).description(
            "Stabiliser actions: hold, up, down, fast-down, probe, probe-end, stale-default, plan "
            "(the fleet plan's pool gear). The "
            "reason string of the latest decision is in `gearshift top` and `gearshift controller explain`."
        ),
        timeseries_panel(
            "Probes and lease expiries (per hour)",
            query(
                f"3600 * {rate_by('gearshift_controller_decisions_total', 'worker', sel(W, PROBE))}",
                "{{worker}} probes",
            ),
            query(
                f"3600 * {rate_by('gearshift_worker_spec_lease_expired_total', 'worker', W)}",
                "{{worker}} lease expired",
            ),
        ).description(
            "Probes at k_max observe positions above the current k; a lease expiry means the "
            "controller did not renew a schedule and the worker fell back to its start-up table."
        ),
        row("Drafter-free gear"),
        timeseries_panel(
            "Mode, phase and gear per worker",
            query(
                f"max by (worker, mode, phase) (gearshift_controller_worker_mode{{{W}}}) * on (worker) group_left "
                f"max by (worker) (gearshift_controller_k_desired{{{W}}})",
                "{{worker}} {{mode}} {{phase}}",
            ),
        ).description(
            "Each worker's drafter-free gear record (the legend: drafter or drafter-free; serving, "
            "draining, restarting or returning) and the k it runs (the value). A draining worker gets no new "
            "requests; a restarting one serves nothing for the profile's restart_s. Set by the leader controller "
            "(GEARSHIFT_DRAFTER_FREE__ENABLED)."
        ),
        row("Fleet placement"),
        timeseries_panel(
            "Pool and gear per worker",
            query(
                f"max by (worker, pool) (gearshift_controller_worker_pool{{{W}}}) * on (worker) group_left "
                f"max by (worker) (gearshift_controller_k_desired{{{W}}})",
                "{{worker}} in {{pool}}",
            ),
        )
        .description(
            "Each worker's pool in the published fleet plan (the legend) and the k it runs there (the "
            "value). A worker missing here is in no plan: its own loop chooses its k."
        )
        .span(8),
        timeseries_panel(
            "Fleet plan",
            query("max by (model) (gearshift_controller_plan_version)", "{{model}} version"),
            query("min by (model) (gearshift_gateway_plan_fresh)", "{{model}} fresh at every gateway"),
        )
        .description(
            "The plan's version grows when the planner changes the pools; a gateway that reads it "
            "older than its TTL routes on load alone (fresh 0)."
        )
        .span(8),
        timeseries_panel(
            "Placement routing (req/s by outcome)",
            query(rate_by("gearshift_gateway_placement_routes_total", "outcome"), "{{outcome}}"),
            unit="reqps",
            stacked=True,
        )
        .description(
            "home: the class's own pool; spill: another pool within its SLA headroom; saturated: "
            "every candidate at its cap (the request waits); unplanned: no fresh plan or no pool for the class."
        )
        .span(8),
        timeseries_panel(
            "Requests by speculation mode (req/s)",
            query(rate_by("gearshift_gateway_speculation_requests_total", "speculation"), "{{speculation}}"),
            unit="reqps",
            stacked=True,
        )
        .description(
            "Finished requests by their speculation mode: the tier's, or the x-gearshift-speculation header's "
            "where the tenant may send it. off: only workers started without a drafter serve them; fast: the "
            "highest k that meets the tier's TPOT target; auto: any worker."
        )
        .span(8),
        row("Acceptance"),
        timeseries_panel(
            "Accepted length (tokens per sequence per step)",
            query(accepted_length(), "{{worker}} observed"),
            query(f"max by (worker) (gearshift_controller_accepted_length{{{W}}})", "{{worker}} controller estimate"),
        ).decimals(2),
        timeseries_panel(
            "Acceptance per draft position",
            query(
                f"{rate_by('vllm:spec_decode_num_accepted_tokens_per_pos_total', 'worker, position', W)} "
                f"/ ignoring (position) group_left "
                f"{rate_by('vllm:spec_decode_num_drafts_total', 'worker', W)}",
                "{{worker}} pos {{position}}",
            ),
            unit="percentunit",
        ).description("a_i = accepted at position i / drafts. Positions above the applied k read zero."),
        timeseries_panel(
            "Draft-token acceptance rate",
            query(
                f"{rate_by('vllm:spec_decode_num_accepted_tokens_total', 'worker', W)} "
                f"/ {rate_by('vllm:spec_decode_num_draft_tokens_total', 'worker', W)}",
                "{{worker}}",
            ),
            unit="percentunit",
        ),
        timeseries_panel(
            "Output tokens per engine step",
            query(
                f"{rate_by('vllm:generation_tokens_total', 'worker', W)} "
                f"/ {rate_by('vllm:iteration_tokens_total_count', 'worker', W)}",
                "{{worker}}",
            ),
        ).decimals(2),
        row("Model and loop health"),
        timeseries_panel(
            "Step time: predicted vs observed",
            query(f"max by (worker) (gearshift_controller_step_predicted_seconds{{{W}}})", "{{worker}} predicted"),
            query(f"max by (worker) (gearshift_controller_step_observed_seconds{{{W}}})", "{{worker}} observed"),
            unit="s",
        ),
        timeseries_panel(
            "TPOT: controller prediction vs engine p50",
            query(f"max by (worker) (gearshift_controller_tpot_predicted_seconds{{{W}}})", "{{worker}} predicted"),
            query(quantile(0.5, "vllm:request_time_per_output_token_seconds", "worker", W), "{{worker}} p50"),
            unit="s",
        ),
        timeseries_panel(
            "Smoothed decode batch", query(f"max by (worker) (gearshift_controller_decode_batch{{{W}}})", "{{worker}}")
        ),
        timeseries_panel(
            "Overloaded and stale workers",
            query(f"max by (worker) (gearshift_controller_overloaded{{{W}}})", "{{worker}} overloaded"),
            query(f"max by (worker) (gearshift_controller_worker_stale{{{W}}})", "{{worker}} stale"),
        ),
        timeseries_panel(
            "Controller: leader, tick p99, failures",
            query("sum(gearshift_controller_leader)", "leaders"),
            query(
                f"histogram_quantile(0.99, sum by (le) "
                f"(rate(gearshift_controller_tick_duration_seconds_bucket[{RI}])))",
                "tick p99 (s)",
            ),
            query(f"sum(rate(gearshift_controller_tick_failures_total[{RI}]))", "tick failures/s"),
            query(
                rate_by("gearshift_controller_actuation_failures_total", "worker", W), "{{worker}} actuation failures/s"
            ),
            query(rate_by("gearshift_controller_scrape_failures_total", "worker", W), "{{worker}} scrape failures/s"),
        ).span(24),
    )
    return dashboard(
        UIDS[1],
        "gearshift / Speculation control",
        "Each worker's speculation length over time, why the controller chose it, and the acceptance it observes.",
        items,
        variables=(worker_variable(),),
        links=(UIDS[0], *UIDS[2:]),
    )


# ------------------------------------------------------------------------------------------------------ cost
def cost() -> board.Dashboard:
    spend_per_worker = (
        "max by (worker) (gearshift_controller_usd_per_mtok) * on (worker) "
        f"sum by (worker) (rate(vllm:generation_tokens_total[{RI}])) * 3600 / 1e6"
    )
    items: tuple[Item, ...] = (
        row("Fleet"),
        stat_panel(
            "Fleet $/Mtok (metered)",
            query(
                f"sum(rate(gearshift_gateway_cost_usd_total[{RI}])) "
                f"/ sum(rate(gearshift_gateway_tokens_total{{{COMPLETION}}}[{RI}])) * 1e6"
            ),
            unit="currencyUSD",
        )
        .span(8)
        .decimals(2),
        stat_panel("Fleet spend rate, USD/h", query(f"sum({spend_per_worker})"), unit="currencyUSD").span(8),
        stat_panel("Speculation savings, USD/h", query(f"3600 * sum({SAVINGS_RATE})"), unit="currencyUSD")
        .description(
            "Modelled cost at k=0 for the same load minus the actual cost, per hour (negative: "
            "speculation cost more than it saved)."
        )
        .span(8),
        row("Per worker"),
        timeseries_panel(
            "$/Mtok per worker: actual vs k=0",
            query(f"max by (worker) (gearshift_controller_usd_per_mtok{{{W}}})", "{{worker}} actual"),
            query(f"max by (worker) (gearshift_controller_usd_per_mtok_k0{{{W}}})", "{{worker}} at k=0"),
            unit="currencyUSD",
        ).description(
            "Output-token cost including the drafter and rejected drafts (idle time included), and "
            "the modelled counterfactual without speculation."
        ),
        timeseries_panel(
            "Drafter and wasted-draft share of step time",
            query(f"max by (worker) (gearshift_controller_drafter_share{{{W}}})", "{{worker}} drafter"),
            query(f"max by (worker) (gearshift_controller_rejected_draft_share{{{W}}})", "{{worker}} rejected drafts"),
            unit="percentunit",
        ),
        timeseries_panel(
            "Speculation savings per worker",
            query(f"3600 * sum by (worker) ({SAVINGS_RATE})", "{{worker}} USD/h"),
            query(
                f"max by (worker) (gearshift_controller_speculation_savings_usd{{{W}}})", "{{worker}} cumulative USD"
            ),
            unit="currencyUSD",
        ).description(
            "The controller's cumulative modelled savings (a gauge: it falls when speculation costs "
            "more than it saves) and its rate of change."
        ),
        timeseries_panel(
            "Spend rate per worker, USD/h", query(spend_per_worker, "{{worker}}"), unit="currencyUSD", stacked=True
        ),
        row("Per tenant"),
        timeseries_panel(
            "$/Mtok per tenant (metered)",
            query(
                f"{rate_by('gearshift_gateway_cost_usd_total', 'tenant', T)} "
                f"/ {rate_by('gearshift_gateway_tokens_total', 'tenant', sel(T, COMPLETION))}"
                " * 1e6",
                "{{tenant}}",
            ),
            unit="currencyUSD",
        ),
        timeseries_panel(
            "Spend per tenant, USD/h: metered vs attributed",
            query(f"3600 * {rate_by('gearshift_gateway_cost_usd_total', 'tenant', T)}", "{{tenant}} metered"),
            query(
                f"3600 * {rate_by('gearshift_controller_tenant_cost_usd_total', 'tenant', T)}", "{{tenant}} attributed"
            ),
            unit="currencyUSD",
        ).description(
            "Metered: per request at the gateway from the worker's published cost per token. "
            "Attributed: the controller's split of each worker's cost by the work the tenant's requests caused."
        ),
    )
    return dashboard(
        UIDS[2],
        "gearshift / Cost",
        "Honest cost per token: drafter overhead and rejected drafts included, per worker and tenant.",
        items,
        variables=(worker_variable(), tenant_variable()),
        links=(*UIDS[:2], UIDS[3]),
    )


# ---------------------------------------------------------------------------------------------- tenants & SLA
def tenants_and_sla(tenants: TenantsConfig) -> board.Dashboard:
    targets = tuple(
        query(f"vector({tier.tpot_target_s})", f"{name} target")
        for name, tier in sorted(tenants.tiers.items())
        if tier.tpot_target_s is not None
    )
    items: tuple[Item, ...] = (
        row("SLA per tier"),
        timeseries_panel(
            "SLA attainment (share of requests within target, 5m)",
            query(f"gearshift:tier_sla_good:ratio_rate5m{{{TIER}}}", "{{tier}} {{slo}}"),
            unit="percentunit",
        ).description("Recorded by deploy/prometheus/rules/gearshift-sla.rules.yml from each tier's targets."),
        timeseries_panel(
            "Error-budget burn rate (1h)",
            query(f"gearshift:tier_sla_burn:rate1h{{{TIER}}}", "{{tier}} {{slo}}"),
            thresholds=((6.0, "orange"), (14.4, "red")),
        ).description("1 spends the error budget exactly over the SLO period; 14.4 pages, 6 opens a ticket."),
        timeseries_panel(
            "TPOT p99 per tier vs target",
            query(quantile(0.99, "gearshift_gateway_time_per_output_token_seconds", "tier", TIER), "{{tier}} p99"),
            *targets,
            unit="s",
        ),
        timeseries_panel(
            "Error ratio per tenant",
            query(
                f"{rate_by('gearshift_gateway_requests_total', 'tenant', sel(T, NOT_OK))} "
                f"/ {rate_by('gearshift_gateway_requests_total', 'tenant', T)}",
                "{{tenant}}",
            ),
            unit="percentunit",
        ),
        row("Usage and limits"),
        timeseries_panel(
            "Requests/s per tenant",
            query(rate_by("gearshift_gateway_requests_total", "tenant", T), "{{tenant}}"),
            unit="reqps",
            stacked=True,
        ),
        timeseries_panel(
            "Tokens/s per tenant",
            query(rate_by("gearshift_gateway_tokens_total", "tenant, kind", T), "{{tenant}} {{kind}}"),
            stacked=True,
        ),
        timeseries_panel(
            "Limits hit (rejections/s)",
            query(
                rate_by("gearshift_gateway_admission_rejections_total", "tenant, reason", T), "{{tenant}} {{reason}}"
            ),
            unit="reqps",
            stacked=True,
        ).description("429s by the limit that tripped: requests/min, tokens/min, concurrency, budget."),
        bargauge_panel(
            "Budget burn: spend over the selected range, USD",
            query(
                f"sum by (tenant) (increase(gearshift_gateway_cost_usd_total{{{T}}}[$__range]))",
                "{{tenant}}",
                instant=True,
            ),
            unit="currencyUSD",
        ),
        timeseries_panel(
            "Spend rate per tenant, USD/day",
            query(f"86400 * {rate_by('gearshift_gateway_cost_usd_total', 'tenant', T, '1h')}", "{{tenant}}"),
            unit="currencyUSD",
        ).span(24),
    )
    return dashboard(
        UIDS[3],
        "gearshift / Tenants and SLA",
        "Per-tenant usage, limits and spend; per-tier SLA attainment and error-budget burn.",
        items,
        variables=(tenant_variable(), tier_variable()),
        links=UIDS[:3],
    )


def all_dashboards(tenants: TenantsConfig) -> tuple[board.Dashboard, ...]:
    return fleet_overview(), speculation_control(), cost(), tenants_and_sla(tenants)
