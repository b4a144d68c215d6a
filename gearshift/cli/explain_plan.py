"""The fleet plan in ``gearshift controller explain``: per model its pools, their gears and caps, the per-class
acceptance estimate with its uncertainty, the planner's predictions, and why it chose this plan."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from fleet.clock import SystemClock
from fleet.config import CommonSettings
from fleet.plan import FleetPlan, PoolPlan, read_plans
from fleet.store.factory import build_store


async def stored_plans(settings: CommonSettings) -> dict[str, FleetPlan]:
    """The plans in the store the settings name (empty with the in-memory store of a separate process)."""
    store = build_store(settings, clock=SystemClock())
    try:
        return await read_plans(store)
    finally:
        await store.close()


def _pools_table(plan: FleetPlan) -> Table:
    table = Table(title="pools", title_justify="left")
    for col in ("pool", "workers", "classes", "drafter", "k", "cap", "predicted batch", "predicted TPOT"):
        table.add_column(col, justify="left" if col in ("pool", "workers", "classes") else "right")
    for pool in plan.pools:
        prefix = f"tpot_s/{pool.name}/"
        tpots = [
            f"{key.removeprefix(prefix)} {value * 1e3:.1f} ms"
            for key, value in plan.predicted.items()
            if key.startswith(prefix)
        ]
        batch = plan.predicted.get(f"batch/{pool.name}")
        table.add_row(
            pool.name, ", ".join(pool.workers), ", ".join(pool.classes), pool.drafter, _gear(pool), _caps(pool),
            "–" if batch is None else f"{batch:.1f}", "; ".join(tpots) or "–",
        )  # fmt: skip
    return table


def _gear(pool: PoolPlan) -> str:
    if pool.k is not None:
        return str(pool.k)
    return "its loop" if pool.k_cap is None else f"its loop ≤ {pool.k_cap}"


def _caps(pool: PoolPlan) -> str:
    per_worker = ", ".join(f"{w} {c}" for w, c in sorted(pool.worker_caps.items()))
    base = str(pool.max_concurrency or "–")
    return f"{base} ({per_worker})" if per_worker else base


def _forecast_table(plan: FleetPlan) -> Table:
    table = Table(title="forecast the pools were sized for (req/s)", title_justify="left")
    for col in ("pool", "class", "expected", "plan for (band's upper edge)", "prompt tok", "output tok"):
        table.add_column(col, justify="left" if col in ("pool", "class") else "right")
    for pool in plan.pools:
        for cls, f in sorted(pool.forecast.items()):
            table.add_row(
                pool.name, cls, f"{f.rate_rps:.2f}", f"{f.upper_rps:.2f}", f"{f.prompt_tokens:.0f}",
                f"{f.output_tokens:.0f}",
            )  # fmt: skip
    return table


def _acceptance_table(plan: FleetPlan) -> Table:
    table = Table(title="per-class acceptance (at the pool's k; k_max where its loop decides)", title_justify="left")
    for col in ("class", "accepted length", "± sd"):
        table.add_column(col, justify="left" if col == "class" else "right")
    prefix = "accepted_length/"
    for key, value in sorted(plan.predicted.items()):
        if key.startswith(prefix):
            cls = key.removeprefix(prefix)
            sd = plan.predicted.get(f"accepted_length_sd/{cls}")
            table.add_row(cls, f"{value:.2f}", "–" if sd is None else f"{sd:.0%}")
    return table


def plan_panel(plan: FleetPlan, *, now: float) -> Panel:
    """One model's plan: its state (fresh or stale, by its TTL), pools, acceptance, predictions and reason."""
    age = plan.age_s(now)
    state = "fresh" if plan.fresh(now) else "STALE: the gateways route on load alone"
    goodput = plan.predicted.get("goodput_tok_s")
    head = Text(
        f"version {plan.version}, issued {age:.0f} s ago (TTL {plan.ttl_s:.0f} s): {state} · spill margin "
        f"{plan.spill_margin:.0%}" + (f" · predicted goodput {goodput:.0f} tok/s" if goodput is not None else "")
    )
    parts: list[RenderableType] = [head, _pools_table(plan)]
    if any(pool.forecast for pool in plan.pools):
        parts.append(_forecast_table(plan))
    body = Group(*parts, _acceptance_table(plan), Text(f"why: {plan.reason}"))
    return Panel(body, title=f"fleet plan: {plan.model}", title_align="left")


def plans_view(plans: Mapping[str, FleetPlan], *, now: float) -> RenderableType:
    """Every model's plan, or a line saying there is none."""
    if not plans:
        return Text(
            "fleet plan: none in the store (the leader plans once the ledger has traffic; in the embedded mode "
            "`gearshift up` holds it in its own memory)"
        )
    return Group(*(plan_panel(plans[m], now=now) for m in sorted(plans)))
