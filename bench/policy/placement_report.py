"""Issue 13's targets and the placement figures, per profile, as a section of ``policies.md``.

Targets, on every mixed-tier scenario with at least ``MIN_WORKERS`` workers (``placement.is_mixed_tier``):

- ``T_UNIFORM``: fleet placement ≥ 1.15 × the best uniform static k's goodput. Where the hindsight ceiling
  itself is below 1.15 × it, the check is not counted (the 97 % target stands alone) and its figures say so;
- ``T_CONTROLLER``: ≥ 1.0 × today's per-worker controller (``gearshift``);
- ``T_CEILING``: ≥ 97 % of the best static placement found in hindsight;
- ``T_SWITCHES``: fewer than 2 k changes per worker-minute (``RunMetrics.switches_per_worker_min``: changes of a
  worker's applied schedule; a plan change that moves a worker changes its k, a change of cap alone is not
  counted).
"""

from __future__ import annotations

import math

from bench.markdown import fmt, pct, table
from bench.policy import placement
from bench.policy.run_metrics import RunMetrics
from bench.policy.scenario import Scenario
from bench.policy.suite import BEST_PLACEMENT, CONTROLLER, FLEET_PLAN, SuiteResult, static_name

MIN_WORKERS = 4
UNIFORM_GAIN = 1.15
CONTROLLER_FLOOR = 1.0
CEILING_SHARE = 0.97
MAX_SWITCHES = 2.0
T_UNIFORM = "fleet placement ≥ 1.15× best uniform static k"
T_CONTROLLER = "≥ 1.0× the per-worker controller"
T_CEILING = "≥ 97 % of the best static placement (hindsight)"
T_SWITCHES = "< 2 plan or k changes per worker-minute"
TARGETS = (T_UNIFORM, T_CONTROLLER, T_CEILING, T_SWITCHES)


def _best_uniform(result: SuiteResult, name: str) -> RunMetrics:
    return max((result.runs[name, static_name(k)] for k in result.static_ks), key=lambda m: m.goodput_tok_s)


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def in_scope(sc: Scenario) -> bool:
    return sc.workers >= MIN_WORKERS and placement.is_mixed_tier(sc)


def checks(result: SuiteResult) -> list[tuple[str, str, str, bool | None]]:
    """(target, scenario, figures, met; None: not counted) for every scenario in scope."""
    out: list[tuple[str, str, str, bool | None]] = []
    for sc in result.scenarios:
        if not in_scope(sc) or (sc.name, FLEET_PLAN) not in result.runs:
            continue
        fp, ctl = result.runs[sc.name, FLEET_PLAN], result.runs[sc.name, CONTROLLER]
        uni, ceil = _best_uniform(result, sc.name), result.runs[sc.name, BEST_PLACEMENT]
        gain, headroom = _ratio(fp.goodput_tok_s, uni.goodput_tok_s), _ratio(ceil.goodput_tok_s, uni.goodput_tok_s)
        value = f"{gain:.2f}× {uni.policy} ({fmt(fp.goodput_tok_s)} vs {fmt(uni.goodput_tok_s)} tok/s)"
        if headroom < UNIFORM_GAIN:
            value += f"; ceiling only {headroom:.2f}× ({fmt(ceil.goodput_tok_s)} tok/s): not counted"
        out.append((T_UNIFORM, sc.name, value, gain >= UNIFORM_GAIN if headroom >= UNIFORM_GAIN else None))
        r = _ratio(fp.goodput_tok_s, ctl.goodput_tok_s)
        text = f"{r:.3f}× ({fmt(fp.goodput_tok_s)} vs {fmt(ctl.goodput_tok_s)} tok/s)"
        out.append((T_CONTROLLER, sc.name, text, r >= CONTROLLER_FLOOR))
        share = _ratio(fp.goodput_tok_s, ceil.goodput_tok_s)
        out.append((T_CEILING, sc.name, f"{pct(share)} of {fmt(ceil.goodput_tok_s)} tok/s", share >= CEILING_SHARE))
        sw = fp.switches_per_worker_min
        out.append((T_SWITCHES, sc.name, f"{fmt(sw)} /worker-min", sw < MAX_SWITCHES))
    return out


def _ceiling_line(result: SuiteResult, sc: Scenario) -> str:
    ceiling = result.ceilings.get(sc.name)
    if ceiling is None:
        return f"- `{sc.name}`: not searched (not mixed-tier, or one worker): the ceiling is the best uniform static k."
    tried = "; ".join(f"{c.describe()} → {fmt(g)} tok/s (model {fmt(c.predicted_tok_s)})" for c, g in ceiling.tried)
    return f"- `{sc.name}`: {ceiling.size:,} placements; verified in the lab: {tried}."


def section(result: SuiteResult) -> list[str]:
    """The placement section of one profile (empty when no scenario has a placement run)."""
    mine = [sc for sc in result.scenarios if placement.is_mixed_tier(sc)]
    if not mine or not any((sc.name, FLEET_PLAN) in result.runs for sc in mine):
        return []
    found = checks(result)
    summary = []
    for target in TARGETS:
        counted = [c for c in found if c[0] == target and c[3] is not None]
        met = sum(1 for c in counted if c[3])
        status = "not exercised" if not counted else ("**met**" if met == len(counted) else "**not met**")
        summary.append([target, f"{met}/{len(counted)}", status])
    detail = [[t, s, v, "—" if m is None else ("met" if m else "**not met**")] for t, s, v, m in found]
    rows = []
    for sc in mine:
        fp, ctl = result.runs[sc.name, FLEET_PLAN], result.runs[sc.name, CONTROLLER]
        uni = _best_uniform(result, sc.name)
        ceil = result.runs[sc.name, BEST_PLACEMENT]
        att = ", ".join(f"{t} {pct(v)}" for t, v in fp.sla_attainment.items())
        knee = result.knees.get(sc.name)
        rows.append(
            [
                sc.name,
                str(sc.workers),
                fmt(fp.goodput_tok_s),
                f"{fmt(uni.goodput_tok_s)} ({uni.policy})",
                fmt(ctl.goodput_tok_s),
                fmt(ceil.goodput_tok_s),
                f"{_ratio(ceil.goodput_tok_s, uni.goodput_tok_s):.2f}×",
                att,
                str(fp.backlog.end) + (" ↑" if fp.backlog.growing else ""),
                fmt(fp.switches_per_worker_min),
                "—" if knee is None else f"{fmt(knee)} req/s",
            ]
        )
    header = [
        "scenario",
        "workers",
        "fleet placement tok/s",
        "best uniform static tok/s",
        "gearshift tok/s",
        "best static placement tok/s",
        "ceiling / uniform",
        "fleet placement SLA met",
        "backlog at end",
        "switches /worker-min",
        "knee (measured)",
    ]
    return [
        f"### Fleet placement (issue 13) — {result.profile}",
        "",
        "Fleet placement is `controller/planner.py` run every 20 s on what the controller measures (per-class rate "
        "and lengths over the last 40 s, per-class acceptance from each worker's counters and its routed mix), "
        "routed by the gateway's own placement filter; best static placement is the hindsight search of "
        "`bench/policy/placement.py` (two pools, each class's share per pool in eighths, each pool's k and cap; "
        "the model screens the space, the best 3 run in the lab). Targets on mixed-tier scenarios with ≥ 4 "
        "workers (`bench/policy/placement_report.py`).",
        "",
        table(["target", "met", "status"], summary, align="lrl"),
        "",
        table(["target", "scenario", "figures", "status"], detail, align="llll"),
        "",
        table(header, rows, align="lr" + "r" * (len(header) - 2)),
        "",
        "Hindsight search per scenario (method above; placements = pool sizes × shares × each pool's k and cap):",
        "",
        *(_ceiling_line(result, sc) for sc in mine),
        "",
    ]
