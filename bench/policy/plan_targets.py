"""Issue 25's and issue 24's targets, per profile, against the honest references (met / not met, with the
figures that decide it and, where missed, the ceiling in numbers).

- ``T_OPERATOR``: the fleet plan (``fleet-plan``) ≥ 0.98× the best of what an operator already has (the
  best uniform static k, vLLM's tuned table, ``no-drafter``) on every scenario;
- ``T_GAIN``: ≥ 1.10× that best on the scenarios marked ``plan_gain`` (the day-long and steady-batch ones);
- ``T_CEILING``: ≥ 97 % of ``best-fleet-plan`` (``bench.policy.references``), at each restart scale;
- ``T_ADAPTIVE``: ``gearshift+adaptive`` ≥ 0.99× ``adaptive`` alone;
- ``T_PLUGIN_FREE`` (issue 24): in every phase where ``no-drafter`` has the highest goodput of the operator's
  configurations (static k, tables, ``no-drafter``), the controller on the plugin's idle-drafter term
  (``gearshift@plugin``) reaches ≥ 0.97× ``no-drafter`` there;
- ``T_PLUGIN_KEEP`` (issue 24): on every scenario, ``gearshift@plugin`` ≥ 0.98× the controller on the stock term.
"""

from __future__ import annotations

import math

from bench.markdown import fmt
from bench.policy.references import RESTART_SCALES, tiled_goodput
from bench.policy.run_metrics import RunMetrics
from bench.policy.scenario import Scenario
from bench.policy.suite import (
    ADAPTIVE,
    BEST_FLEET_PLAN,
    CONTROLLER,
    CONTROLLER_ADAPTIVE,
    FLEET_PLAN,
    NO_DRAFTER,
    OPERATOR,
    PLUGIN_CONTROLLER,
    SuiteResult,
    static_name,
)
from bench.policy.targets import Check

OPERATOR_SHARE = 0.98
PLAN_GAIN = 1.10
CEILING_SHARE = 0.97
ADAPTIVE_SHARE = 0.99
PLUGIN_FREE_SHARE = 0.97
PLUGIN_KEEP_SHARE = 0.98

T_OPERATOR = "fleet plan ≥ 0.98× best of {best uniform static, vllm-table, no-drafter}"
T_GAIN = "fleet plan ≥ 1.10× that best (day-long, steady-batch)"
T_CEILING = "fleet plan ≥ 97 % of best-fleet-plan"
T_ADAPTIVE = "gearshift+adaptive ≥ 0.99× adaptive"
T_PLUGIN_FREE = "plugin tax: controller ≥ 0.97× no-drafter where no-drafter is best"
T_PLUGIN_KEEP = "plugin tax: controller ≥ 0.98× its stock-tax goodput"
TARGETS = (T_OPERATOR, T_GAIN, T_CEILING, T_ADAPTIVE, T_PLUGIN_FREE, T_PLUGIN_KEEP)


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def operator_best(result: SuiteResult, scenario: str) -> RunMetrics:
    """The best of what an operator already has on ``scenario`` (``suite.OPERATOR``)."""
    runs = [result.runs[scenario, p] for p in OPERATOR if (scenario, p) in result.runs]
    return max(runs, key=lambda m: m.goodput_tok_s)


def _ceiling_note(result: SuiteResult, scenario: str) -> str:
    ceiling = result.reference(scenario, BEST_FLEET_PLAN)
    op = tiled_goodput(operator_best(result, scenario))
    return (
        f"; ceiling: best-fleet-plan {fmt(ceiling.goodput_tok_s)} tok/s phase-tiled "
        f"= {_ratio(ceiling.goodput_tok_s, op):.3f}× the operator's best ({ceiling.describe()})"
    )


def _operator_checks(result: SuiteResult, sc: Scenario) -> list[Check]:
    plan, op = result.runs[sc.name, FLEET_PLAN], operator_best(result, sc.name)
    got = _ratio(plan.goodput_tok_s, op.goodput_tok_s)
    value = f"{got:.3f}× {op.policy} ({fmt(plan.goodput_tok_s)} vs {fmt(op.goodput_tok_s)} tok/s)"
    met = got >= OPERATOR_SHARE
    out = [Check(T_OPERATOR, sc.name, value + ("" if met else _ceiling_note(result, sc.name)), met)]
    if sc.plan_gain:
        met = got >= PLAN_GAIN
        out.append(Check(T_GAIN, sc.name, value + ("" if met else _ceiling_note(result, sc.name)), met))
    return out


def _ceiling_checks(result: SuiteResult, sc: Scenario) -> list[Check]:
    plan = tiled_goodput(result.runs[sc.name, FLEET_PLAN])
    out = []
    for scale in RESTART_SCALES:
        ref = result.reference(sc.name, BEST_FLEET_PLAN, scale)
        share = _ratio(plan, ref.goodput_tok_s)
        value = (
            f"{share:.1%} ({fmt(plan)} vs {fmt(ref.goodput_tok_s)} tok/s phase-tiled at restart "
            f"{ref.restart_s:.0f} s: {ref.describe()})"
        )
        out.append(Check(T_CEILING, f"{sc.name} @ {scale:g}× restart", value, share >= CEILING_SHARE))
    return out


def _adaptive_check(result: SuiteResult, sc: Scenario) -> Check:
    both, alone = result.runs[sc.name, CONTROLLER_ADAPTIVE], result.runs[sc.name, ADAPTIVE]
    got = _ratio(both.goodput_tok_s, alone.goodput_tok_s)
    value = f"{got:.3f}× ({fmt(both.goodput_tok_s)} vs {fmt(alone.goodput_tok_s)} tok/s)"
    return Check(T_ADAPTIVE, sc.name, value, got >= ADAPTIVE_SHARE)


def _phase_goodput(m: RunMetrics, phase: str) -> float:
    return next(p.goodput_tok_s for p in m.phases if p.name == phase)


def _plugin_checks(result: SuiteResult, sc: Scenario) -> list[Check]:
    if (sc.name, PLUGIN_CONTROLLER) not in result.runs:
        return []
    plugin, stock = result.runs[sc.name, PLUGIN_CONTROLLER], result.runs[sc.name, CONTROLLER]
    configs = [static_name(k) for k in result.static_ks] + ["vllm-table", "gate"]
    out = []
    for phase in sc.phases:
        free = _phase_goodput(result.runs[sc.name, NO_DRAFTER], phase.name)
        others = [_phase_goodput(result.runs[sc.name, c], phase.name) for c in configs if (sc.name, c) in result.runs]
        if free <= 0 or free <= max(others, default=0.0):
            continue
        mine = _phase_goodput(plugin, phase.name)
        got = _ratio(mine, free)
        stock_phase = fmt(_phase_goodput(stock, phase.name))
        value = f"{got:.3f}× ({fmt(mine)} vs {fmt(free)} tok/s; stock-tax controller {stock_phase})"
        out.append(Check(T_PLUGIN_FREE, f"{sc.name} / {phase.name}", value, got >= PLUGIN_FREE_SHARE))
    got = _ratio(plugin.goodput_tok_s, stock.goodput_tok_s)
    value = f"{got:.3f}× ({fmt(plugin.goodput_tok_s)} vs {fmt(stock.goodput_tok_s)} tok/s)"
    out.append(Check(T_PLUGIN_KEEP, sc.name, value, got >= PLUGIN_KEEP_SHARE))
    return out


def checks(result: SuiteResult) -> list[Check]:
    """Every target of issues 25 and 24 on every scenario of the profile."""
    out: list[Check] = []
    for sc in result.scenarios:
        if (sc.name, FLEET_PLAN) in result.runs:
            out += _operator_checks(result, sc) + _ceiling_checks(result, sc)
        if (sc.name, CONTROLLER_ADAPTIVE) in result.runs:
            out.append(_adaptive_check(result, sc))
        out += _plugin_checks(result, sc)
    return out


def summary_rows(result: SuiteResult) -> list[list[object]]:
    all_checks = checks(result)
    rows: list[list[object]] = []
    for target in TARGETS:
        mine = [c for c in all_checks if c.target == target]
        met = sum(c.met for c in mine)
        status = "not exercised" if not mine else ("**met**" if met == len(mine) else "**not met**")
        rows.append([target, f"{met}/{len(mine)}", status])
    return rows
