"""``gearshift controller explain``: per worker, the estimate, every candidate k's predictions, the decision."""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from controller.full_speed import advertised_text, expected_batch_size
from controller.loop import WorkerRuntime


def _estimate_line(rt: WorkerRuntime) -> Text:
    est = rt.estimate
    if est is None:
        return Text("no estimate yet")
    al = f"{est.accepted_length:.2f}" if est.accepted_length is not None else "—"
    acc = ", ".join(f"{p:.2f}" for p in est.conditional)
    parts = [
        f"k applied {rt.k_applied if rt.k_applied is not None else '?'}, desired {rt.k_desired}",
        f"decode batch {est.batch:.1f}",
        f"waiting {est.waiting:.1f}",
        f"KV {est.kv_usage:.0%}",
        f"preemptions {est.preemption_rate:.2f}/s",
        f"context/seq {est.context_per_seq:.0f} tok",
        f"step correction ×{est.step_correction:.2f}",
        f"observed AL {al}",
        f"p_i [{acc}] ({est.observed_positions} observed)",
    ]
    if est.stale:
        parts.insert(0, f"STALE for {est.stale_for_s:.0f} s")
    return Text(" · ".join(parts))


def candidates_table(rt: WorkerRuntime) -> Table:
    target = f"{rt.tpot_target_s * 1e3:.0f} ms" if rt.tpot_target_s is not None else "none"
    ttft = f"{rt.ttft_target_s:.1f} s" if rt.ttft_target_s is not None else "none"
    table = Table(title=f"candidates (TPOT target {target}, TTFT target {ttft})", title_justify="left")
    columns = (
        "k", "AL tok/step", "step ms", "drafter ms", "TPOT ms", "prefill s", "meets TTFT", "goodput tok/s",
        "meets target", "allowed", "full speed",
    )  # fmt: skip
    for col in columns:
        table.add_column(col, justify="right")
    decision = rt.decision
    if decision is None:
        return table
    for c in decision.candidates:
        style = "bold green" if rt.k_desired == c.k else None
        table.add_row(
            str(c.k), f"{c.accepted_length:.2f}", f"{c.step_s * 1e3:.1f}", f"{c.drafter_s * 1e3:.2f}",
            f"{c.tpot_s * 1e3:.1f}", f"{c.ttft_s:.2f}" if c.ttft_s is not None else "—",
            "yes" if c.ttft_ok else "no", f"{c.goodput_tok_s:.0f}", "yes" if c.feasible else "no",
            "yes" if c.allowed else "no", "yes" if c.full_speed else "no", style=style,
        )  # fmt: skip
    return table


def full_speed_line(rt: WorkerRuntime) -> Text:
    """What the worker advertises at full speed, and the candidates that set excludes at the expected batch."""
    line = f"full speed (advertised): {advertised_text(rt.full_speed)}"
    decision, est = rt.decision, rt.estimate
    if decision is not None and est is not None:
        excluded = [c.excluded_by for c in decision.candidates if not c.full_speed]
        batch = expected_batch_size(est.batch)
        line += f" · excluded at batch {batch}: {'; '.join(excluded)}" if excluded else " · none excluded"
    return Text(line)


def _cost_line(rt: WorkerRuntime) -> Text:
    cost = rt.cost
    if cost is None or cost.usd_per_mtok is None:
        return Text("cost: no output in the last window")
    k0 = cost.usd_per_mtok_k0 or 0.0
    off = f", drafter-free: ${cost.usd_per_mtok_off:.2f}/Mtok" if cost.usd_per_mtok_off is not None else ""
    return Text(
        f"cost ${cost.usd_per_mtok:.2f}/Mtok (at k=0: ${k0:.2f}/Mtok{off}) · drafter {cost.drafter_share:.1%} · "
        f"rejected drafts {cost.rejected_share:.1%} · savings so far ${rt.savings_usd:.4f}"
    )


def explain(workers: Iterable[WorkerRuntime]) -> Group:
    """One panel per worker: estimate, candidate table, cost, and the stabiliser's action with its reason."""
    panels = []
    for rt in workers:
        action = rt.action
        verdict = Text(f"{action.kind.value} → k={action.k}: {action.reason}" if action else "no decision yet")
        overloaded = " [OVERLOADED]" if rt.decision is not None and rt.decision.overloaded else ""
        body = Group(_estimate_line(rt), candidates_table(rt), full_speed_line(rt), _cost_line(rt), verdict)
        panels.append(Panel(body, title=f"{rt.config.id} ({rt.config.model}){overloaded}", title_align="left"))
    return Group(*panels)
