"""The policy report: the targets, the goodput and frontier tables, one table per scenario, and the plots."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

from bench.markdown import fmt, pct, table
from bench.policy import pieces, placement_report, plan_report
from bench.policy import plots as plotting
from bench.policy.frontier import FRONTIER_SCENARIO, MATCHED_SPEEDS, frontier_points, throughput_at
from bench.policy.run_metrics import RunMetrics
from bench.policy.suite import CONTROLLER, SuiteResult
from bench.policy.targets import checks, settled_k, summary_rows

FULL_COMMAND = "gearshift bench policies --profiles all --processes 2"
PLAN_KEY = "_references_and_targets"
"""``policies.json``'s key for issue 25's references and targets, per profile (beside the scenario keys)."""


def _targets_section(result: SuiteResult) -> list[str]:
    rows = [[c.target, c.scenario, c.value, "met" if c.met else "**not met**"] for c in checks(result)]
    return [
        f"### Targets — {result.profile}",
        "",
        table(["target", "passed", "status"], summary_rows(result), align="lrl"),
        "",
        f"#### Targets table — {result.profile}",
        "",
        table(["target", "scenario", "figure", "status"], rows, align="llll"),
        "",
    ]


def _capacity_lines(result: SuiteResult) -> list[str]:
    rows = [
        [sc, phase, fmt(c.rate_per_s), f"k={c.k}", fmt(c.model_rate_per_s), str(c.probes)]
        for sc, phases in result.capacities.items()
        for phase, c in phases.items()
    ]
    if not rows:
        return []
    header = ["scenario", "phase", "capacity req/s", "reached by", "model's estimate req/s", "probes"]
    return [f"### Measured capacity — {result.profile}", "", table(header, rows, align="llrlrr"), ""]


def _figures_section(result: SuiteResult, plots: dict[str, str]) -> list[str]:
    return [
        f"### Goodput table — {result.profile}",
        "",
        "Goodput in output tokens/s delivered inside the window within each tier's SLA. Best per row in bold; "
        "a backlog that grew across the window is marked ↑ (the policy did not serve its load).",
        "",
        _goodput_table(result),
        "",
        f"![goodput per scenario per policy]({plots['goodput']})",
        "",
        "#### Throughput–interactivity frontier",
        "",
        f"Each point is one phase of `{FRONTIER_SCENARIO}` (concurrency 1 … 128): median per-user tokens/s "
        f"against aggregate output tokens/s.\n\n![frontier]({plots['frontier']})",
        "",
        "#### Throughput at matched interactivity",
        "",
        "Aggregate output tokens/s each policy sustains while giving every user the stated median speed "
        "(interpolated along its frontier; — where the policy never runs at that speed).",
        "",
        _matched_table(result, FRONTIER_SCENARIO),
        "",
        "#### Cost per million output tokens",
        "",
        "Every worker is paid for the whole window; the bars split that into the target model's useful work, the "
        "drafter, the verification of drafts that were rejected, and idle time.",
        "",
        f"![cost split]({plots['cost']})",
        "",
        "#### k over time",
        "",
        f"![k over time]({plots['k_over_time']})",
        "",
    ]


HEADER = (
    "Every policy runs on the same seeded trace of each scenario on simulated Kimi K3 + DSpark workers "
    "(`workers/sim`), once per profile of the family, requests placed by the gateway's own routing scorers "
    "(`bench/policy/routing.py`); the controller is `controller.loop.Controller` itself, ticking in virtual time. "
    "Under the controller the gateway's speculation-aware scorers see the worker state it publishes; under the "
    "other policies nothing is published and routing is least-loaded, as in production without a controller. "
    "Every run is also priced by the controller's own cost model (`bench/policy/cost_meter.py`). "
    "The recipe default is static k = the profile's k_max (vLLM's recipe runs DSpark at fixed k = 7). "
    "Every policy runs on workers started with their drafter, so a k = 0 step (static k=0, or a controller's "
    "off) pays the profile's idle-drafter tax (`fleet.perf.IdleDrafterTax`, ASSUMED: +6.5 % → +21.6 % step "
    "time with the batch); `no-drafter` is k = 0 on workers started without speculation, the reference only a "
    "drafter-free gear reaches (an oracle candidate since issue 25: a switch to or from it pays restart_s)."
)

DEFINITIONS = (
    "**Goodput** counts only output tokens delivered inside the measured window by requests that met their "
    "tier's SLA; tokens delivered after the window's end never count. A request still unfinished at the "
    "window's end keeps its in-window tokens only if its TTFT and its TPOT so far meet the targets. The drain "
    "after the last phase runs for latency figures only. **Backlog** is the requests arrived and unfinished at "
    "the window's end (↑: it grew across the window). **Load** `0.6` is 60 % of the fleet's measured capacity "
    "for that phase's mix on that profile: the highest Poisson rate at which the best static k keeps every "
    "tier's SLA at ≥ 99 % without a growing backlog, found by bisection in virtual time "
    "(`bench/policy/load.py`). Definitions of every figure are in `bench/policy/run_metrics.py`; baselines and "
    "the oracle in `bench/policy/suite.py`; targets in `bench/policy/targets.py` and `bench/policy/plan_targets.py`. "
    "The oracle is a hindsight plan (`bench/policy/references.py`): per phase the best of every static k, "
    "`vllm-table` and `no-drafter`, restarts charged; `oracle-k` is the run of the best static k per phase, "
    "switched at the phase boundaries; *where speculation does not pay* means a phase in which k=0 had "
    "strictly the highest goodput of the static k."
)


def render(results: Mapping[str, SuiteResult], *, command: str, plots: Mapping[str, dict[str, str]]) -> str:
    lines = [
        "# Speculation policies in virtual time",
        "",
        f"Regenerate with `{FULL_COMMAND}`, or a piece at a time (`--profile P --scenario S`: each run replaces its "
        f"pieces under `{pieces.PIECES}/` beside this report, which is written from all of them). Last run: "
        f"`{command}`. {HEADER}",
        "",
        DEFINITIONS,
        "",
        f"Profiles: {', '.join(f'`{name}`' for name in results)}. Policies: {', '.join(_policies(results))}.",
        "",
    ]
    for name, result in results.items():
        skipped = f" Not run here: {', '.join(result.skipped)} (`Scenario.fits`)." if result.skipped else ""
        lines += [f"## Profile {name}", "", f"Recipe default: `{result.recipe}`.{skipped}", ""]
        lines += _targets_section(result)
        lines += plan_report.section(result, plots[name].get(plan_report.PLAN_PLOT))
        lines += placement_report.section(result)
        lines += _capacity_lines(result)
        lines += _figures_section(result, plots[name])
        for sc in result.scenarios:
            lines += _scenario_section(result, sc.name, sc.description)
    return "\n".join(lines)


def _policies(results: Mapping[str, SuiteResult]) -> list[str]:
    seen: list[str] = []
    for result in results.values():
        seen += [p for p in result.policies() if p not in seen]
    return seen


def _matched_table(result: SuiteResult, scenario: str) -> str:
    rows = []
    for p in result.policies():
        pts = frontier_points(result, p, scenario)
        rows.append([p, *(fmt(throughput_at(pts, v)) for v in MATCHED_SPEEDS)])
    header = ["policy", *(f"tok/s at {v:g} tok/s/user" for v in MATCHED_SPEEDS)]
    return table(header, rows, align="l" + "r" * len(MATCHED_SPEEDS))


def _goodput_table(result: SuiteResult) -> str:
    policies = result.policies()
    rows = []
    for sc in result.scenarios:
        runs = [result.runs[sc.name, p] for p in policies]
        best = max(m.goodput_tok_s for m in runs)
        cells = [f"**{fmt(m.goodput_tok_s)}**" if m.goodput_tok_s == best else fmt(m.goodput_tok_s) for m in runs]
        rows.append([sc.name] + [c + (" ↑" if m.backlog.growing else "") for c, m in zip(cells, runs, strict=True)])
    return table(["scenario", *policies], rows, align="l" + "r" * len(policies))


def _scenario_row(m: RunMetrics) -> list[str]:
    return [
        m.policy,
        fmt(m.goodput_tok_s),
        fmt(m.throughput_tok_s),
        ", ".join(f"{tier} {pct(v)}" for tier, v in m.sla_attainment.items()),
        f"{m.backlog.start}→{m.backlog.end}" + (" ↑" if m.backlog.growing else ""),
        fmt(m.ttft_p50_s),
        fmt(m.ttft_p99_s),
        fmt(m.tpot_p50_s * 1e3),
        fmt(m.tpot_p99_s * 1e3),
        fmt(m.per_user_tok_s_p50),
        fmt(m.accepted_length),
        fmt(m.mean_k),
        fmt(m.cost.total),
        pct(m.drafter_share),
        pct(m.rejected_share),
        fmt(m.model_cost.usd_per_mtok) if m.model_cost else "—",
        pct(m.model_cost.savings_vs_k0) if m.model_cost else "—",
        fmt(m.switches_per_worker_min),
        fmt(m.step_k_changes_per_worker_min),
    ]


def _scenario_section(result: SuiteResult, name: str, description: str) -> list[str]:
    header = [
        "policy",
        "goodput tok/s",
        "throughput tok/s",
        "SLA met",
        "backlog start→end",
        "TTFT p50 s",
        "TTFT p99 s",
        "TPOT p50 ms",
        "TPOT p99 ms",
        "per-user tok/s",
        "accepted length",
        "mean k",
        "$/Mtok",
        "drafter share",
        "rejected-draft share",
        "$/Mtok (cost model)",
        "saved vs k=0 (cost model)",
        "switches /worker-min",
        "step-k changes /worker-min",
    ]
    rows = [_scenario_row(result.runs[name, p]) for p in result.policies()]
    choice = result.oracle_choice.get(name, {})
    tables = result.baselines.get(name, {})
    return [
        f"### Scenario {name} — {result.profile}",
        "",
        description,
        "",
        f"Oracle k per phase: {', '.join(f'{k}: {v}' for k, v in choice.items())}. "
        f"vllm-table: `{tables.get('vllm-table', '')}`; gate: `{tables.get('gate', '')}`.",
        "",
        f"#### {name} table — {result.profile}",
        "",
        table(header, rows, align="l" + "r" * (len(header) - 1)),
        "",
        *_phase_table(result, name),
    ]


def _phase_table(result: SuiteResult, name: str) -> list[str]:
    """Per phase: the oracle's k, the controller's settled k, and each phase's backlog under the controller."""
    ctl = result.runs[name, CONTROLLER]
    choice = result.oracle_choice.get(name, {})
    sc = next(s for s in result.scenarios if s.name == name)
    rows = []
    for (phase, start, end), pm in zip(sc.phase_bounds(), ctl.phases, strict=True):
        rows.append(
            [
                phase.name,
                str(choice.get(phase.name, "—")),
                _k_cell(settled_k(ctl, start, end)),
                fmt(pm.goodput_tok_s),
                f"{pm.backlog.start}→{pm.backlog.end}" + (" ↑" if pm.backlog.growing else ""),
            ]
        )
    header = ["phase", "oracle k", "controller k (second half, most common)", "controller goodput", "backlog"]
    return [f"#### {name} phases — {result.profile}", "", table(header, rows, align="llrrr"), ""]


def _k_cell(k: int | None) -> str:
    return "—" if k is None else str(k)


PLOTS = ("goodput", "frontier", "cost", "k_over_time")


def write(results: Mapping[str, SuiteResult], out_dir: Path, *, command: str) -> Path:
    """Store ``results``' pieces under ``out_dir`` (``bench.policy.pieces``: a run of some profiles and scenarios
    replaces those and keeps the others), then write ``policies.md``, ``policies.json`` and the PNGs (one set per
    profile) from every stored piece; returns the Markdown path. Older ``policies-*.png`` there are removed first
    (they would be stale)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = pieces.store(results, out_dir)
    for old in out_dir.glob("policies-*.png"):
        old.unlink()
    plots: dict[str, dict[str, str]] = {}
    for name, result in results.items():
        mine = {part: f"policies-{name}-{part.replace('_', '-')}.png" for part in PLOTS}
        plotting.plot_goodput(result, out_dir / mine["goodput"])
        plotting.plot_frontier(result, out_dir / mine["frontier"])
        plotting.plot_cost(result, out_dir / mine["cost"])
        plotting.plot_k_over_time(result, out_dir / mine["k_over_time"])
        if any(sc.name == plan_report.SURGE for sc in result.scenarios):
            mine[plan_report.PLAN_PLOT] = f"policies-{name}-plan-surge.png"
            plotting.plot_plan_over_time(result, plan_report.SURGE, out_dir / mine[plan_report.PLAN_PLOT])
        plots[name] = mine
    summary: dict[str, object] = dict(summary_json(results))
    summary[PLAN_KEY] = {name: plan_report.summary_json(result) for name, result in results.items()}
    (out_dir / "policies.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    path = out_dir / "policies.md"
    path.write_text(render(results, command=command, plots=plots))
    return path


def _num(v: float) -> float | None:
    return None if math.isnan(v) else round(v, 4)


def summary_json(results: Mapping[str, SuiteResult]) -> dict[str, dict[str, dict[str, dict[str, object]]]]:
    """scenario → profile → policy → the headline figures (``policies.json``; NaN written as null)."""
    out: dict[str, dict[str, dict[str, dict[str, object]]]] = {}
    for name, result in results.items():
        for (scenario, policy), m in result.runs.items():
            out.setdefault(scenario, {}).setdefault(name, {})[policy] = {
                "goodput_tok_s": _num(m.goodput_tok_s),
                "throughput_tok_s": _num(m.throughput_tok_s),
                "backlog_requests": m.backlog.end,
                "backlog_growing": m.backlog.growing,
                "sla_attainment": {tier: _num(v) for tier, v in m.sla_attainment.items()},
                "switches_per_worker_min": _num(m.switches_per_worker_min),
            }
    return out
