"""The policy report's PNG plots (matplotlib, Agg backend): goodput per scenario, the frontier, the cost split
and k over time against load."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.policy.frontier import FRONTIER_SCENARIO
from bench.policy.suite import CONTROLLER, FLEET_PLAN, SuiteResult, static_name


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
    ax.legend(ncol=6, fontsize=8, loc="upper right")
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
    ax.legend(fontsize=8, loc="upper right")
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
    axes[0][0].legend(fontsize=7, loc="upper right")
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


def plot_plan_over_time(result: SuiteResult, scenario: str, path: Path) -> None:
    """The fleet plan on ``scenario``: each worker's k (the plan's gear, or its per-worker loop's) over time
    against the fleet's load (requests running + waiting), phase boundaries marked."""
    m = result.runs[scenario, FLEET_PLAN]
    sc = next(s for s in result.scenarios if s.name == scenario)
    fig, ax = plt.subplots(figsize=(10, 3.2), constrained_layout=True)
    load_ax = ax.twinx()
    for w in sorted({t.worker for t in m.ticks}):
        ts = [t for t in m.ticks if t.worker == w]
        ax.step([t.t_s for t in ts], [t.k for t in ts], where="post", label=f"k, worker {w}")
    by_t: dict[float, int] = {}
    for t in m.ticks:
        by_t[t.t_s] = by_t.get(t.t_s, 0) + t.running + t.waiting
    load_ax.plot(list(by_t), list(by_t.values()), color="grey", alpha=0.5, lw=0.8, label="fleet requests")
    for phase, start, _ in sc.phase_bounds():
        ax.axvline(start, color="black", lw=0.6, ls=":")
        ax.text(start, 8.1, phase.name, fontsize=7)
    ax.set_ylim(-0.5, 8.5)
    ax.set_ylabel("k")
    load_ax.set_ylabel("running + waiting (fleet)")
    ax.set_xlabel("virtual seconds")
    ax.set_title(
        f"{scenario} on {result.profile}: {FLEET_PLAN}, pools, gears and drafter modes by the plan", fontsize=9
    )
    ax.legend(fontsize=7, loc="upper left")
    fig.savefig(path, dpi=90)
    plt.close(fig)
