"""The policy report: the targets table, per-scenario tables, and PNG plots (matplotlib, Agg backend)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.markdown import fmt, pct, table
from bench.metrics import PhaseMetrics, RunMetrics
from bench.scenario import Scenario
from bench.suite import CONTROLLER, ORACLE, STATIC_KS, SuiteResult, static_name

FRONTIER_SCENARIO = "concurrency-sweep"
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
    ctl, oracle = result.runs[name, CONTROLLER], result.runs[name, ORACLE]
    share = ctl.goodput_tok_s / oracle.goodput_tok_s if oracle.goodput_tok_s > 0 else math.nan
    value = f"{pct(share)} ({fmt(ctl.goodput_tok_s)} vs {fmt(oracle.goodput_tok_s)} tok/s)"
    return Check(T_ORACLE, name, value, share >= ORACLE_SHARE)


def _mixed_check(result: SuiteResult, name: str) -> Check:
    ctl, best = result.runs[name, CONTROLLER], _best_static(result, name)
    gain = ctl.goodput_tok_s / best.goodput_tok_s - 1 if best.goodput_tok_s > 0 else math.nan
    return Check(T_MIXED, name, f"{gain:+.1%} vs {best.policy} ({fmt(best.goodput_tok_s)} tok/s)", gain >= MIXED_GAIN)


def _k0_checks(result: SuiteResult, sc: Scenario) -> list[Check]:
    """One check per phase in which k = 0 has the best goodput of the static k (and a non-zero one)."""
    out = []
    statics = [result.runs[sc.name, static_name(k)] for k in STATIC_KS]
    for phase in sc.phases:
        good = {m.policy: _phase(m, phase.name).goodput_tok_s for m in statics}
        base = good[static_name(0)]
        if base <= 0 or max(good, key=lambda p: (good[p], p == static_name(0))) != static_name(0):
            continue  # speculation pays here, or no static k meets any SLA (nothing to compare)
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


def _summary_rows(result: SuiteResult) -> list[list[object]]:
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


def render(result: SuiteResult, *, command: str, plots: dict[str, str]) -> str:
    cs = checks(result)
    lines = [
        "# Speculation policies in virtual time",
        "",
        f"Regenerate with `{command}`. Every policy runs on the same seeded trace of each scenario on simulated "
        "Kimi K3 + DSpark workers (`workers/sim`, profile named per scenario); the controller is "
        "`controller.loop.Controller` itself, ticking in virtual time. Definitions of every figure are in "
        "`bench/metrics.py`; baselines and the oracle in `bench/suite.py`.",
        "",
        "## Targets",
        "",
        "### Targets summary",
        "",
        table(["target", "passed", "status"], _summary_rows(result), align="lrl"),
        "",
        "### Targets table",
        "",
        table(
            ["target", "scenario", "figure", "status"],
            [[c.target, c.scenario, c.value, "met" if c.met else "**not met**"] for c in cs],
            align="llll",
        ),
        "",
        "## Goodput by scenario and policy",
        "",
        "Goodput in output tokens/s within each tier's SLA (`tiers` of the scenario). Best per row in bold.",
        "",
        "### Goodput table",
        "",
        _goodput_table(result),
        "",
        f"![goodput per scenario per policy]({plots['goodput']})",
        "",
        "## Throughput–interactivity frontier",
        "",
        f"Each point is one phase of `concurrency-sweep` (concurrency 1 … 128): median per-user tokens/s against "
        f"aggregate output tokens/s.\n\n![frontier]({plots['frontier']})",
        "",
        "### Throughput at matched interactivity",
        "",
        "Aggregate output tokens/s each policy sustains while giving every user the stated median speed "
        "(interpolated along its frontier; — where the policy never runs at that speed).",
        "",
        _matched_table(result, FRONTIER_SCENARIO),
        "",
        "## Cost per million output tokens",
        "",
        f"![cost split]({plots['cost']})",
        "",
        "## k over time",
        "",
        f"![k over time]({plots['k_over_time']})",
        "",
    ]
    for sc in result.scenarios:
        lines += _scenario_section(result, sc.name, sc.description)
    return "\n".join(lines)


MATCHED_SPEEDS: tuple[float, ...] = (50.0, 100.0, 150.0, 200.0, 300.0)
"""Per-user speeds (tokens/s) at which the frontier table reads each policy's throughput."""


def frontier_points(result: SuiteResult, policy: str, scenario: str) -> list[tuple[float, float]]:
    """``(median per-user tok/s, throughput tok/s)`` per phase of ``scenario``, sorted by per-user speed."""
    m = result.runs.get((scenario, policy))
    if m is None:
        return []
    return sorted((p.per_user_tok_s_p50, p.throughput_tok_s) for p in m.phases if not math.isnan(p.per_user_tok_s_p50))


def throughput_at(points: list[tuple[float, float]], speed: float) -> float | None:
    """Throughput on the frontier at per-user ``speed`` (linear between phases; None outside their range).
    Where the frontier is not monotone the best throughput reached at that speed or faster counts."""
    best: float | None = None
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= speed <= x1 and x1 > x0:
            y = y0 + (y1 - y0) * (speed - x0) / (x1 - x0)
            best = y if best is None else max(best, y)
    return best


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
        values = [result.runs[sc.name, p].goodput_tok_s for p in policies]
        best = max(values)
        rows.append([sc.name] + [f"**{fmt(v)}**" if v == best else fmt(v) for v in values])
    return table(["scenario", *policies], rows, align="l" + "r" * len(policies))


def _scenario_section(result: SuiteResult, name: str, description: str) -> list[str]:
    header = [
        "policy",
        "goodput tok/s",
        "throughput tok/s",
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
        "switches /worker-min",
        "step-k changes /worker-min",
    ]
    rows = []
    for p in result.policies():
        m = result.runs[name, p]
        rows.append(
            [
                p,
                fmt(m.goodput_tok_s),
                fmt(m.throughput_tok_s),
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
                fmt(m.switches_per_worker_min),
                fmt(m.step_k_changes_per_worker_min),
            ]
        )
    choice = result.oracle_choice.get(name, {})
    tables = result.baselines.get(name, {})
    return [
        f"## Scenario {name}",
        "",
        description,
        "",
        f"Oracle k per phase: {', '.join(f'{k}: {v}' for k, v in choice.items())}. "
        f"vllm-table: `{tables.get('vllm-table', '')}`; gate: `{tables.get('gate', '')}`.",
        "",
        f"### {name} table",
        "",
        table(header, rows, align="l" + "r" * (len(header) - 1)),
        "",
    ]


# ------------------------------------------------------------------------------------------------- plots
def plot_goodput(result: SuiteResult, path: Path) -> None:
    policies = result.policies()
    names = [s.name for s in result.scenarios]
    fig, ax = plt.subplots(figsize=(12, 4.5), constrained_layout=True)
    width = 0.85 / len(policies)
    for i, p in enumerate(policies):
        ref = [max(result.runs[n, static_name(0)].goodput_tok_s, 1e-9) for n in names]
        values = [result.runs[n, p].goodput_tok_s / r for n, r in zip(names, ref, strict=True)]
        ax.bar([x + i * width for x in range(len(names))], values, width, label=p)
    ax.set_xticks([x + width * (len(policies) - 1) / 2 for x in range(len(names))], names, rotation=15)
    ax.set_ylabel("goodput relative to k=0")
    ax.legend(ncol=5, fontsize=8)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_frontier(result: SuiteResult, path: Path, scenario: str = FRONTIER_SCENARIO) -> None:
    fig, ax = plt.subplots(figsize=(7, 5), constrained_layout=True)
    runs = [m for (s, _), m in result.runs.items() if s == scenario]
    if not runs:  # the sweep was not run: use every scenario's phases
        runs = list(result.runs.values())
    for p in result.policies():
        pts = sorted(
            (ph.per_user_tok_s_p50, ph.throughput_tok_s)
            for m in runs
            if m.policy == p
            for ph in m.phases
            if not math.isnan(ph.per_user_tok_s_p50)
        )
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", ms=3, label=p)
    ax.set_xlabel("per-user speed, tokens/s (median)")
    ax.set_ylabel("output throughput, tokens/s")
    ax.set_title(f"throughput–interactivity frontier ({scenario})")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_cost(result: SuiteResult, path: Path) -> None:
    policies = result.policies()
    names = [s.name for s in result.scenarios]
    cols = min(4, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 3.6 * rows), constrained_layout=True, squeeze=False)
    parts = (("target", "tab:blue"), ("drafter", "tab:orange"), ("rejected_drafts", "tab:red"), ("idle", "tab:gray"))
    for ax in axes.flat[len(names) :]:
        ax.set_visible(False)
    for ax, n in zip(axes.flat, names, strict=False):
        bottom = [0.0] * len(policies)
        for part, colour in parts:
            values = [getattr(result.runs[n, p].cost, part) for p in policies]
            values = [0.0 if math.isnan(v) else v for v in values]
            ax.bar(range(len(policies)), values, bottom=bottom, color=colour, label=part.replace("_", " "))
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set_xticks(range(len(policies)), policies, rotation=70, fontsize=7)
        ax.set_title(n, fontsize=9)
    for row in axes:
        row[0].set_ylabel("USD per million output tokens")
    axes[0][0].legend(fontsize=7)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_k_over_time(result: SuiteResult, path: Path) -> None:
    names = [s.name for s in result.scenarios]
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 2.3 * len(names)), constrained_layout=True, squeeze=False)
    for ax, n in zip(axes[:, 0], names, strict=True):
        m = result.runs[n, CONTROLLER]
        load_ax = ax.twinx()
        for w in sorted({t.worker for t in m.ticks}):
            ts = [t for t in m.ticks if t.worker == w]
            ax.step([t.t_s for t in ts], [t.k for t in ts], where="post", label=f"k, worker {w}")
            load_ax.plot(
                [t.t_s for t in ts],
                [t.running + t.waiting for t in ts],
                alpha=0.35,
                lw=0.8,
                label=f"requests, worker {w}",
            )
        ax.set_ylim(-0.5, 8.5)
        ax.set_ylabel("k")
        load_ax.set_ylabel("running + waiting")
        ax.set_title(f"{n}: gearshift controller", fontsize=9)
    axes[-1][0].set_xlabel("virtual seconds")
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write(result: SuiteResult, out_dir: Path, *, command: str) -> Path:
    """Write ``policies.md`` and its PNGs into ``out_dir``; returns the Markdown path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = {
        "goodput": "policies-goodput.png",
        "frontier": "policies-frontier.png",
        "cost": "policies-cost.png",
        "k_over_time": "policies-k-over-time.png",
    }
    plot_goodput(result, out_dir / plots["goodput"])
    plot_frontier(result, out_dir / plots["frontier"])
    plot_cost(result, out_dir / plots["cost"])
    plot_k_over_time(result, out_dir / plots["k_over_time"])
    path = out_dir / "policies.md"
    path.write_text(render(result, command=command, plots=plots))
    return path
