"""The report's section for issues 25 and 24: the honest references per scenario (what an operator already has,
the oracle, the best fleet plan at each restart cost) beside the fleet plan, the controller on both idle-drafter
terms and adaptive verification, then the targets (``bench.policy.plan_targets``)."""

from __future__ import annotations

from bench.markdown import fmt, table
from bench.policy import plan_targets
from bench.policy.references import RESTART_SCALES, tiled_goodput
from bench.policy.suite import (
    ADAPTIVE,
    BEST_FLEET_PLAN,
    CONTROLLER,
    CONTROLLER_ADAPTIVE,
    FLEET_PLAN,
    ORACLE,
    PLUGIN_CONTROLLER,
    SuiteResult,
)

SURGE = "plan-surge"
"""The scenario whose fleet plan is plotted over time (issue 25: the plan must move before the surge)."""
PLAN_PLOT = "plan_surge"

NOTE = (
    "References and the `…(tiled)` columns are phase-tiled (`bench/policy/references.py`: the phases' whole "
    "duration, warm-up included), the others each run's own goodput over its measured window. "
    "`oracle`: per phase the best of every static k, `vllm-table` and `no-drafter`; `best-fleet-plan`: the same "
    "with the best static two-pool placement (a lower bound on the true ceiling: no pools of mixed drafter mode, "
    "no per-phase placement search). Both are hindsight plans composed from the measured runs "
    "(`bench/policy/references.py`): a switch to or from `no-drafter` restarts every worker, losing restart_s × "
    "the phase's goodput rate. `operator` is the best of the best uniform static k, `vllm-table` and "
    "`no-drafter`. `@plugin`: the run on the plugin's idle-drafter term (issue 24) instead of the stock one."
)


def _g(result: SuiteResult, scenario: str, policy: str) -> str:
    m = result.runs.get((scenario, policy))
    return fmt(m.goodput_tok_s) if m is not None else "–"


def _references_table(result: SuiteResult) -> str:
    header = ["scenario", "operator", "operator (tiled)", "oracle"]
    header += [f"best-fleet-plan @{s:g}× restart" for s in RESTART_SCALES]
    header += [f"{FLEET_PLAN} (tiled)", FLEET_PLAN, CONTROLLER, PLUGIN_CONTROLLER, ADAPTIVE]
    header += [CONTROLLER_ADAPTIVE]
    rows = []
    for sc in result.scenarios:
        op = plan_targets.operator_best(result, sc.name)
        oracle = result.reference(sc.name, ORACLE).goodput_tok_s
        row = [sc.name, f"{fmt(op.goodput_tok_s)} ({op.policy})", fmt(tiled_goodput(op)), fmt(oracle)]
        row += [fmt(result.reference(sc.name, BEST_FLEET_PLAN, s).goodput_tok_s) for s in RESTART_SCALES]
        row.append(fmt(tiled_goodput(result.runs[sc.name, FLEET_PLAN])))
        row += [_g(result, sc.name, p) for p in header[5 + len(RESTART_SCALES) :]]
        rows.append(row)
    return table(header, rows, align="l" + "r" * (len(header) - 1))


def _plans_table(result: SuiteResult) -> str:
    rows = []
    for sc in result.scenarios:
        for name in (ORACLE, BEST_FLEET_PLAN):
            ref = result.reference(sc.name, name)
            rows.append([sc.name, name, ref.describe(), fmt(ref.restart_tokens)])
    return table(["scenario", "reference", "plan per phase (1× restart)", "tokens lost to restarts"], rows)


def _surge_lines(result: SuiteResult, plot: str | None) -> list[str]:
    if plot is None:
        return []
    m = result.runs[SURGE, FLEET_PLAN]
    sc = next(s for s in result.scenarios if s.name == SURGE)
    lines = [f"#### {SURGE}: the fleet plan over time — {result.profile}", "", f"![{SURGE}]({plot})", ""]
    rows = []
    for phase, start, end in sc.phase_bounds():
        ks = sorted({t.k for t in m.ticks if start <= t.t_s < end})
        p = next(x for x in m.phases if x.name == phase.name)
        rows.append([phase.name, f"{start:.0f}–{end:.0f}", str(ks), fmt(p.goodput_tok_s), fmt(p.throughput_tok_s)])
    attainment = ", ".join(f"{t} {v:.1%}" for t, v in m.sla_attainment.items())
    lines += [table(["phase", "virtual s", "k held", "goodput tok/s", "throughput tok/s"], rows), ""]
    lines += [f"SLA attainment over the window: {attainment}. No worker restarts in the lab's fleet plan.", ""]
    return lines


def section(result: SuiteResult, plot: str | None = None) -> list[str]:
    all_checks = plan_targets.checks(result)
    rows = [[c.target, c.scenario, c.value, "met" if c.met else "**not met**"] for c in all_checks]
    return [
        *_surge_lines(result, plot),
        f"### Honest references (issue 25) — {result.profile}",
        "",
        f"Goodput, tok/s. Restart cost 1× = {result.restart_s:g} s (the profile's `serving.restart_s`). {NOTE}",
        "",
        _references_table(result),
        "",
        _plans_table(result),
        "",
        f"### Targets of issues 25 and 24 — {result.profile}",
        "",
        table(["target", "passed", "status"], plan_targets.summary_rows(result), align="lrl"),
        "",
        table(["target", "scenario", "figure", "status"], rows, align="llll"),
        "",
    ]


def summary_json(result: SuiteResult) -> dict[str, object]:
    """The references and the targets of one profile, for ``policies.json``."""
    refs = {
        f"{sc}/{name}@{scale:g}x": {
            "goodput_tok_s": round(r.goodput_tok_s, 4),
            "restart_s": r.restart_s,
            "plan": dict(r.choice),
        }
        for (sc, name, scale), r in result.refs.items()
    }
    checks = [
        {"target": c.target, "scenario": c.scenario, "figure": c.value, "met": c.met}
        for c in plan_targets.checks(result)
    ]
    return {"references": refs, "targets": checks}
