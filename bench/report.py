"""The policy report: the targets table, per-scenario tables, and PNG plots (matplotlib, Agg backend)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench.markdown import fmt, pct, table  # noqa: E402
from bench.metrics import RunMetrics  # noqa: E402
from bench.suite import CONTROLLER, ORACLE, STATIC_KS, SuiteResult, static_name  # noqa: E402

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


def checks(result: SuiteResult) -> list[Check]:
    """The issue's four targets, per scenario (or per phase where k = 0 is the best static k)."""
    out: list[Check] = []
    for sc in result.scenarios:
        ctl, oracle = result.runs[sc.name, CONTROLLER], result.runs[sc.name, ORACLE]
        share = ctl.goodput_tok_s / oracle.goodput_tok_s if oracle.goodput_tok_s > 0 else math.nan
        out.append(Check("≥ 95 % of the oracle's goodput", sc.name,
                         f"{pct(share)} ({fmt(ctl.goodput_tok_s)} vs {fmt(oracle.goodput_tok_s)} tok/s)",
                         share >= ORACLE_SHARE))  # fmt: skip
        if sc.mixed:
            best = _best_static(result, sc.name)
            gain = ctl.goodput_tok_s / best.goodput_tok_s - 1 if best.goodput_tok_s > 0 else math.nan
            out.append(Check("≥ +20 % over the best single static k (mixed)", sc.name,
                             f"{gain:+.1%} vs {best.policy} ({fmt(best.goodput_tok_s)} tok/s)", gain >= MIXED_GAIN))  # fmt: skip
        k0 = result.runs[sc.name, static_name(0)]
        for phase in sc.phases:
            statics = [result.runs[sc.name, static_name(k)] for k in STATIC_KS]
            good = {m.policy: _phase(m, phase.name).goodput_tok_s for m in statics}
            if max(good, key=lambda p: (good[p], p == static_name(0))) != static_name(0):
                continue
            mine, base = _phase(ctl, phase.name).goodput_tok_s, _phase(k0, phase.name).goodput_tok_s
            ratio = mine / base - 1 if base > 0 else math.nan
            out.append(Check("never > 3 % below k=0 where speculation does not pay", f"{sc.name} / {phase.name}",
                             f"{ratio:+.1%} vs k=0", ratio >= -K0_TOLERANCE))  # fmt: skip
        out.append(Check("< 2 k switches per worker-minute", sc.name, f"{ctl.switches_per_worker_min:.2f}",
                         ctl.switches_per_worker_min < MAX_SWITCHES))  # fmt: skip
    return out


def _phase(m: RunMetrics, name: str):  # type: ignore[no-untyped-def]
    return next(p for p in m.phases if p.name == name)


def _summary_rows(result: SuiteResult) -> list[list[object]]:
    rows: list[list[object]] = []
    for target in dict.fromkeys(c.target for c in checks(result)):
        mine = [c for c in checks(result) if c.target == target]
        met = sum(c.met for c in mine)
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
        table(["target", "scenario", "figure", "status"],
              [[c.target, c.scenario, c.value, "met" if c.met else "**not met**"] for c in cs], align="llll"),  # fmt: skip
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


def _goodput_table(result: SuiteResult) -> str:
    policies = result.policies()
    rows = []
    for sc in result.scenarios:
        values = [result.runs[sc.name, p].goodput_tok_s for p in policies]
        best = max(values)
        rows.append([sc.name] + [f"**{fmt(v)}**" if v == best else fmt(v) for v in values])
    return table(["scenario", *policies], rows, align="l" + "r" * len(policies))


def _scenario_section(result: SuiteResult, name: str, description: str) -> list[str]:
    header = ["policy", "goodput tok/s", "throughput tok/s", "TTFT p50 s", "TTFT p99 s", "TPOT p50 ms",
              "TPOT p99 ms", "per-user tok/s", "accepted length", "mean k", "$/Mtok", "drafter share",
              "rejected-draft share", "switches /worker-min", "step-k changes /worker-min"]  # fmt: skip
    rows = []
    for p in result.policies():
        m = result.runs[name, p]
        rows.append([p, fmt(m.goodput_tok_s), fmt(m.throughput_tok_s), fmt(m.ttft_p50_s), fmt(m.ttft_p99_s),
                     fmt(m.tpot_p50_s * 1e3), fmt(m.tpot_p99_s * 1e3), fmt(m.per_user_tok_s_p50),
                     fmt(m.accepted_length), fmt(m.mean_k), fmt(m.cost.total), pct(m.drafter_share),
                     pct(m.rejected_share), fmt(m.switches_per_worker_min), fmt(m.step_k_changes_per_worker_min)])  # fmt: skip
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


def plot_frontier(result: SuiteResult, path: Path, scenario: str = "concurrency-sweep") -> None:
    fig, ax = plt.subplots(figsize=(7, 5), constrained_layout=True)
    runs = [m for (s, _), m in result.runs.items() if s == scenario]
    if not runs:  # the sweep was not run: use every scenario's phases
        runs = list(result.runs.values())
    for p in result.policies():
        pts = sorted(
            (ph.per_user_tok_s_p50, ph.throughput_tok_s)
            for m in runs if m.policy == p for ph in m.phases if not math.isnan(ph.per_user_tok_s_p50)
        )  # fmt: skip
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
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 4), constrained_layout=True, squeeze=False)
    parts = (("target", "tab:blue"), ("drafter", "tab:orange"), ("rejected_drafts", "tab:red"), ("idle", "tab:gray"))
    for ax, n in zip(axes[0], names, strict=True):
        bottom = [0.0] * len(policies)
        for part, colour in parts:
            values = [getattr(result.runs[n, p].cost, part) for p in policies]
            values = [0.0 if math.isnan(v) else v for v in values]
            ax.bar(range(len(policies)), values, bottom=bottom, color=colour, label=part.replace("_", " "))
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set_xticks(range(len(policies)), policies, rotation=70, fontsize=7)
        ax.set_title(n, fontsize=9)
    axes[0][0].set_ylabel("USD per million output tokens")
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
            load_ax.plot([t.t_s for t in ts], [t.running + t.waiting for t in ts], alpha=0.35, lw=0.8,
                         label=f"requests, worker {w}")  # fmt: skip
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
