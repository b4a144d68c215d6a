"""The replay report: Markdown plus two PNGs (goodput per policy and tier, k over time), and the verdict line."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.markdown import fmt, pct, table
from bench.policy.suite import CONTROLLER
from bench.replay.check import METRICS, TOLERANCE, CheckResult
from bench.replay.confidence import LEVEL
from bench.replay.run import ReplayResult


def verdict(result: ReplayResult) -> str:
    """One line: the controller's goodput and $/Mtok against the recipe default (static k = k_max)."""
    ctl, recipe = result.runs.get(CONTROLLER), result.runs[result.recipe]
    if ctl is None:
        gave = fmt(recipe.metrics.goodput_tok_s)
        return f"the controller was not run; the recipe default ({result.recipe}) gave {gave} tok/s"
    gain = ctl.metrics.goodput_tok_s / recipe.metrics.goodput_tok_s - 1 if recipe.metrics.goodput_tok_s else math.nan
    cheaper = 1 - ctl.usd_per_mtok / recipe.usd_per_mtok if recipe.usd_per_mtok else math.nan
    more = "more" if gain >= 0 else "less"
    lower = "lower" if cheaper >= 0 else "higher"
    return (
        f"the controller would have given {abs(gain) * 100:.1f} % {more} goodput ({abs(cheaper) * 100:.1f} % {lower} "
        f"$/Mtok) than static {result.recipe} (the recipe default) on this trace"
    )


def _plot_goodput(result: ReplayResult, path: Path) -> None:
    runs = list(result.runs.values())
    tiers = sorted({t for r in runs for t in r.tiers})
    fig, ax = plt.subplots(figsize=(10, 4), constrained_layout=True)
    bottom = [0.0] * len(runs)
    for tier in tiers:
        values = [r.tiers[tier].goodput_tok_s if tier in r.tiers else 0.0 for r in runs]
        ax.bar([r.policy for r in runs], values, bottom=bottom, label=tier)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("goodput within SLA, tok/s")
    ax.legend(title="tier")
    ax.tick_params(axis="x", rotation=20)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_k(result: ReplayResult, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 4), constrained_layout=True)
    for run in result.runs.values():
        if run.k_over_time:
            ax.plot([t / 60 for t, _ in run.k_over_time], [k for _, k in run.k_over_time], label=run.policy)
    ax.set_xlabel("trace time, min")
    ax.set_ylabel("mean k over the workers")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def render(result: ReplayResult, *, command: str, stem: str) -> str:
    plan, sc, trace = result.plan, result.plan.scenario, result.plan.trace
    lines = [
        f"# What-if replay: {Path(trace.source).name}",
        "",
        f"**Verdict:** {verdict(result)}.",
        "",
        f"Command: `{command}`",
        "",
        f"- Trace: `{trace.source}` ({trace.format}), {len(trace.requests)} requests over "
        f"{trace.duration_s / 60:.1f} min (after a speed-up of {trace.speed:g}×), "
        f"{sum(1 for r in trace.requests if r.session)} of them in sessions (replayed closed-loop).",
    ]
    if trace.cut:
        lines.append(f"- **Cut:** {trace.cut} requests past the run's end were not replayed.")
    if trace.left_out:
        lines.append(f"- {trace.left_out} rows without output tokens (refused or failed requests) were left out.")
    if plan.unknown_hints:
        lines.append(f"- Workload hints the profile has no class for (run as its default): {plan.unknown_hints}.")
    lines += [
        f"- Fleet: {sc.workers} workers of profile `{plan.profile_path}`, max_num_seqs {sc.seqs}; "
        f"phases of {sc.phases[0].duration_s:g} s ({len(sc.phases)}).",
        f"- Acceptance classes: {', '.join(f'{k}: {v}' for k, v in sorted(plan.class_source.items()))}.",
        f"- Wall time of the whole run: {result.wall_s:.1f} s.",
        "",
        "Goodput counts only output tokens delivered inside the trace's window by requests that met their tier's "
        "SLA; backlog is the requests still open at the window's end (arrived minus finished).",
        "",
    ]
    tiers = sorted({t for r in result.runs.values() for t in r.tiers})
    header = ["policy", "goodput tok/s", "throughput tok/s", "$/Mtok", "drafter share", "backlog", "switches/w-min"]
    rows: list[list[object]] = []
    for run in result.runs.values():
        m = run.metrics
        rows.append(
            [
                run.policy,
                m.goodput_tok_s,
                m.throughput_tok_s,
                m.cost.total,
                pct(m.drafter_share),
                m.backlog.end,
                m.switches_per_worker_min,
            ]
        )
    lines += ["## Every policy", "", table(header, rows), "", f"![goodput]({stem}-goodput.png)", ""]
    for tier in tiers:
        tier_rows: list[list[object]] = []
        for run in result.runs.values():
            t = run.tiers.get(tier)
            if t is None:
                continue
            attained = run.metrics.sla_attainment.get(tier, math.nan)
            tier_rows.append(
                [run.policy, t.goodput_tok_s, pct(attained), t.ttft_p50_s, t.ttft_p99_s, t.tpot_p50_s, t.tpot_p99_s]
            )
        lines += [
            f"## Tier `{tier}`",
            "",
            table(
                ["policy", "goodput tok/s", "SLA met", "TTFT p50 s", "TTFT p99 s", "TPOT p50 s", "TPOT p99 s"],
                tier_rows,
            ),
            "",
        ]
    lines += [
        "## k over time",
        "",
        f"Oracle's k per phase: {', '.join(f'{p}={k}' for p, k in result.oracle_choice.items())}.",
        "",
        f"![k over time]({stem}-k.png)",
        "",
    ]
    if result.fleets:
        lines += [
            "## Smallest fleet meeting every tier's SLA (`--workers auto`)",
            "",
            table(["policy", "workers"], [[p, "more than 256" if n is None else n] for p, n in result.fleets.items()]),
            "",
        ]
    return "\n".join(lines)


def write(result: ReplayResult, out: Path, *, command: str, stem: str = "replay") -> Path:
    """Write ``<stem>.md`` and its PNGs into ``out``; return the Markdown's path."""
    out.mkdir(parents=True, exist_ok=True)
    _plot_goodput(result, out / f"{stem}-goodput.png")
    _plot_k(result, out / f"{stem}-k.png")
    path = out / f"{stem}.md"
    path.write_text(render(result, command=command, stem=stem) + "\n")
    return path


def render_check(result: CheckResult, *, command: str) -> str:
    """The prediction-against-reality table: per run (policy), tier and metric, measured vs predicted."""
    c = result.config
    lines = [
        "# Replay prediction checked against the embedded stack",
        "",
        f"Command: `{command}`",
        "",
        f"Real HTTP traffic through the embedded gateway for {c.duration_s:g} s per run ({c.rate_per_s:g} req/s "
        f"open-loop per tier, {c.sessions} closed-loop interactive sessions with {c.think_s:g} s think time, "
        f"prompts of {c.prompt_words[0]}–{c.prompt_words[1]} words, {c.max_tokens[0]}–{c.max_tokens[1]} output "
        f"tokens), once with the controller and once at static k={c.static_k}. Each run's ledger was replayed with "
        f"the profile `gearshift profile` fitted to one of the stack's workers ({result.profile_name}, fitted in "
        f"{result.fit_s:.0f} s) under the policy that ran. Measured: the gateway's own ledger (TTFT from arrival "
        "to the first chunk, TPOT over the tokens after the first; throughput = output tokens of requests "
        "finished inside the window per second). Target: every predicted figure within "
        f"{TOLERANCE * 100:.0f} % of the measured one. Wall time of the whole check: {result.wall_s:.0f} s.",
        "",
    ]
    lines += [
        f"Each measured figure has its {LEVEL * 100:.0f} % confidence interval from its samples (n: TTFT and TPOT the "
        "requests, throughput the requests finished in the window; `bench.replay.confidence`: order statistics for a "
        "quantile, a compound Poisson sum for a throughput; ∞: too few samples for that side). A figure off by more "
        f"than {TOLERANCE * 100:.0f} % is *within its CI* when some value in that interval would be within "
        f"{TOLERANCE * 100:.0f} % (the samples cannot tell), a **miss** when none would be.",
        "",
    ]
    for comp in result.comparisons:
        counts = comp.verdicts()
        lines += [
            f"## {comp.policy} ({comp.records} requests): {counts['within']} within {TOLERANCE * 100:.0f} %, "
            f"{counts['within its CI']} more within their CI, {counts['miss']} missed",
            "",
        ]
        rows: list[list[object]] = []
        for tier, measured in comp.measured.items():
            predicted = comp.predicted.get(tier)
            if predicted is None:
                continue
            for metric in METRICS:
                judged = comp.judge(tier, metric)
                interval = measured.intervals.get(metric)
                rows.append(
                    [
                        tier, metric, measured.samples.get(metric, "–"), getattr(measured, metric),
                        _span(interval.lo, interval.hi, fmt) if interval else "–", getattr(predicted, metric),
                        pct(judged.error), _span(judged.interval.lo, judged.interval.hi, pct),
                        "**miss**" if judged.verdict == "miss" else judged.verdict,
                    ]
                )  # fmt: skip
        ci = f"{LEVEL * 100:.0f} % CI"
        header = ["tier", "figure", "n", "measured", ci, "predicted", "error", "error CI", "verdict"]
        lines += [table(header, rows), ""]
    return "\n".join(lines)


def _span(lo: float, hi: float, show: Callable[[float], str]) -> str:
    """``[lo, hi]``, an unbounded side as ∞ (−100 % is the error's bound below when the measured one is ∞)."""
    return f"[{show(lo) if lo > -math.inf else '−∞'}, {show(hi) if hi < math.inf else '∞'}]"
