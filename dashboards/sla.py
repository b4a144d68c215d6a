"""Prometheus rules for SLA attainment and error-budget burn per tier, generated from the tenants file.

Each tier with a TPOT or TTFT target gets the share of its requests within target, over four windows, from
the gateway's latency histograms: ``bucket{le=threshold} / count``. A histogram only answers at its bucket
bounds, so the threshold is the largest bound not above the target (conservative: a request counts as within
target only if it is provably so); the ``threshold_s`` label shows the bound used. Burn rate is the
multi-window, multi-burn-rate scheme of the Google SRE workbook: 14.4× over 1 h and 5 m pages, 6× over 6 h and
30 m opens a ticket, against an objective of ``objective`` (the share of requests that must be within target).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fleet.config import TenantsConfig
from gateway.usage.metrics import TPOT, TTFT, GatewayMetrics

WINDOWS = ("5m", "30m", "1h", "6h")
GOOD = "gearshift:tier_sla_good:ratio_rate{window}"
BURN = "gearshift:tier_sla_burn:rate{window}"
RECORDED = tuple(name.format(window=w) for name in (GOOD, BURN) for w in WINDOWS)
"""Every series these rules record (dashboards may use them)."""


def bucket_bounds(histogram: str) -> list[tuple[float, str]]:
    """The gateway histogram's bucket bounds, as (seconds, the ``le`` label text Prometheus stores)."""
    metrics = GatewayMetrics()
    by_name = {TPOT: metrics.tpot, TTFT: metrics.ttft}
    by_name[histogram].labels(tier="probe").observe(0.0)
    bounds = [
        (float(sample.labels["le"]), sample.labels["le"])
        for family in metrics.registry.collect()
        if family.name == histogram
        for sample in family.samples
        if sample.name.endswith("_bucket") and sample.labels["le"] != "+Inf"
    ]
    return sorted(bounds)


def threshold(target_s: float, histogram: str) -> str:
    """The ``le`` text of the largest bucket bound not above ``target_s``; ValueError if none is."""
    usable = [text for bound, text in bucket_bounds(histogram) if bound <= target_s + 1e-12]
    if not usable:
        raise ValueError(f"target {target_s} s is below the smallest bucket of {histogram}")
    return usable[-1]


def _targets(tenants: TenantsConfig) -> Iterator[tuple[str, str, str, float]]:
    """(tier, slo name, histogram, target seconds) for every target a tier sets."""
    for tier_name, tier in sorted(tenants.tiers.items()):
        if tier.tpot_target_s is not None:
            yield tier_name, "tpot", TPOT, tier.tpot_target_s
        if tier.ttft_target_s is not None:
            yield tier_name, "ttft", TTFT, tier.ttft_target_s


def _good_rules(tenants: TenantsConfig) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for tier, slo, histogram, target in _targets(tenants):
        le = threshold(target, histogram)
        for window in WINDOWS:
            good = f'sum by (tier) (rate({histogram}_bucket{{tier="{tier}", le="{le}"}}[{window}]))'
            total = f'sum by (tier) (rate({histogram}_count{{tier="{tier}"}}[{window}]))'
            rules.append(
                {
                    "record": GOOD.format(window=window),
                    "expr": f"{good} / {total}",
                    "labels": {"slo": slo, "target_s": str(target), "threshold_s": le},
                }
            )
    return rules


RUNBOOKS = "https://github.com/gearshift/gearshift/blob/main/docs/operations/runbooks/"
"""Where every rule's ``runbook_url`` points (docs/operations/runbooks/<alert>.md)."""


def _alerts() -> list[dict[str, Any]]:
    def burn(window: str) -> str:
        return BURN.format(window=window)

    def alert(name: str, long: str, short: str, factor: float, severity: str, runbook: str) -> dict[str, Any]:
        return {
            "alert": name,
            "expr": f"{burn(long)} > {factor} and {burn(short)} > {factor}",
            "for": "2m",
            "labels": {"severity": severity},
            "annotations": {
                "runbook_url": f"{RUNBOOKS}{runbook}.md",
                "summary": f"Tier {{{{ $labels.tier }}}} burns its {{{{ $labels.slo }}}} error budget over {factor}x "
                "too fast",
                "description": f"Over {long} and {short}, more than {factor}x the allowed share of requests of tier "
                "{{ $labels.tier }} missed the {{ $labels.slo }} target of {{ $labels.target_s }} s.",
            },
        }

    return [
        alert("GearshiftSLABurnFast", "1h", "5m", 14.4, "page", "sla-burn-fast"),
        alert("GearshiftSLABurnSlow", "6h", "30m", 6.0, "ticket", "sla-burn-slow"),
    ]


def sla_rules(tenants: TenantsConfig, *, objective: float = 0.99) -> dict[str, Any]:
    """The rule file (as data) for ``tenants``'s tier targets; ``objective`` is the SLO, 0 < objective < 1."""
    if not 0.0 < objective < 1.0:
        raise ValueError(f"objective: must be between 0 and 1, got {objective}")
    budget = round(1.0 - objective, 6)
    burn_rules = [
        {"record": BURN.format(window=w), "expr": f"(1 - {GOOD.format(window=w)}) / {budget}"} for w in WINDOWS
    ]
    return {
        "groups": [
            {"name": "gearshift-sla-records", "rules": _good_rules(tenants) + burn_rules},
            {"name": "gearshift-sla-alerts", "rules": _alerts()},
        ]
    }
