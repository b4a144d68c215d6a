"""The issue's targets for the controller, checked against a suite's runs (met / not met, with figures)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.markdown import fmt, pct
from bench.policy.run_metrics import PhaseMetrics, RunMetrics
from bench.policy.scenario import Scenario
from bench.policy.suite import CONTROLLER, ORACLE, STATIC_KS, SuiteResult, static_name

ORACLE_SHARE = 0.95
MIXED_GAIN = 0.20
K0_TOLERANCE = 0.03
MAX_SWITCHES = 2.0


@dataclass(frozen=True)
class Check:
    target: str
    scenario: str
    value: str
    met: bool


def _best_static(result: SuiteResult, scenario: str) -> RunMetrics:
    return max((result.runs[scenario, static_name(k)] for k in STATIC_KS), key=lambda m: m.goodput_tok_s)


T_ORACLE = "≥ 95 % of the oracle's goodput"
T_MIXED = "≥ +20 % over the best single static k (mixed)"
T_K0 = "never > 3 % below k=0 where speculation does not pay"
T_SWITCHES = "< 2 k switches per worker-minute"
TARGETS = (T_ORACLE, T_MIXED, T_K0, T_SWITCHES)


def _oracle_check(result: SuiteResult, name: str) -> Check:
    """Against the better of the oracle's run and the best static k (the oracle may always keep one k)."""
    ctl, oracle, best = result.runs[name, CONTROLLER], result.runs[name, ORACLE], _best_static(result, name)
    ref = oracle if oracle.goodput_tok_s >= best.goodput_tok_s else best
    share = ctl.goodput_tok_s / ref.goodput_tok_s if ref.goodput_tok_s > 0 else math.nan
    value = f"{pct(share)} ({fmt(ctl.goodput_tok_s)} vs {fmt(ref.goodput_tok_s)} tok/s, {ref.policy})"
    return Check(T_ORACLE, name, value, share >= ORACLE_SHARE)


def _gain(m: RunMetrics, best: RunMetrics) -> float:
    return m.goodput_tok_s / best.goodput_tok_s - 1 if best.goodput_tok_s > 0 else math.nan


def _mixed_check(result: SuiteResult, name: str) -> Check:
    """The controller's gain over the best static k, next to the oracle's own (the ceiling a per-phase k
    reaches on this trace: where it is below the target, the target is out of reach of any phase-wise k)."""
    ctl, oracle, best = result.runs[name, CONTROLLER], result.runs[name, ORACLE], _best_static(result, name)
    gain, ceiling = _gain(ctl, best), _gain(oracle, best)
    value = f"{gain:+.1%} vs {best.policy} ({fmt(best.goodput_tok_s)} tok/s); oracle's own margin {ceiling:+.1%}"
    return Check(T_MIXED, name, value, gain >= MIXED_GAIN)


def mixed_ceiling(result: SuiteResult) -> list[tuple[str, float]]:
    """Per mixed scenario, the oracle's goodput gain over the best single static k (fraction)."""
    return [
        (sc.name, _gain(result.runs[sc.name, ORACLE], _best_static(result, sc.name)))
        for sc in result.scenarios
        if sc.mixed
    ]


def _k0_checks(result: SuiteResult, sc: Scenario) -> list[Check]:
    """One check per phase in which k = 0 has strictly the best goodput of the static k."""
    out = []
    statics = [result.runs[sc.name, static_name(k)] for k in STATIC_KS]
    for phase in sc.phases:
        good = {m.policy: _phase(m, phase.name).goodput_tok_s for m in statics}
        base = good.pop(static_name(0))
        if base <= 0 or base <= max(good.values()):
            continue  # some k > 0 does at least as well here: speculation pays (or nothing meets the SLA)
        ratio = _phase(result.runs[sc.name, CONTROLLER], phase.name).goodput_tok_s / base - 1
        out.append(Check(T_K0, f"{sc.name} / {phase.name}", f"{ratio:+.1%} vs k=0", ratio >= -K0_TOLERANCE))
    return out


def checks(result: SuiteResult) -> list[Check]:
    """The issue's four targets, per scenario (or per phase where k = 0 is the best static k)."""
    out: list[Check] = []
    for sc in result.scenarios:
        out.append(_oracle_check(result, sc.name))
        if sc.mixed:
            out.append(_mixed_check(result, sc.name))
        out += _k0_checks(result, sc)
        switches = result.runs[sc.name, CONTROLLER].switches_per_worker_min
        out.append(Check(T_SWITCHES, sc.name, f"{switches:.2f}", switches < MAX_SWITCHES))
    return out


def _phase(m: RunMetrics, name: str) -> PhaseMetrics:
    return next(p for p in m.phases if p.name == name)


def summary_rows(result: SuiteResult) -> list[list[object]]:
    rows: list[list[object]] = []
    all_checks = checks(result)
    for target in TARGETS:
        mine = [c for c in all_checks if c.target == target]
        met = sum(c.met for c in mine)
        if not mine:
            rows.append([target, "0/0", "not exercised (no scenario or phase qualifies)"])
            continue
        rows.append([target, f"{met}/{len(mine)}", "**met**" if met == len(mine) else "**not met**"])
    return rows
