"""``gearshift usage budgets``: each budgeted tenant's budget, its period, what it has spent in the current period
and when the budget next resets by itself, as the gateway's admin API reports them (``GET /admin/v1/tenants``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any

import httpx
import typer

from fleet.bearer import bearer_header
from fleet.config import ConfigError
from gateway.settings import GatewaySettings

COLUMNS = ("tenant", "budget_usd", "period", "spent_usd", "left_usd", "period_started", "next_reset")


async def fetch_budgets(gateway_url: str, admin_key: str, *, tenant: str | None = None) -> list[dict[str, Any]]:
    """The admin API's views of the tenants with a budget (or of ``tenant`` alone), sorted by id."""
    base = gateway_url.rstrip("/")
    url = f"{base}/admin/v1/tenants" + (f"/{tenant}" if tenant else "")
    async with httpx.AsyncClient(timeout=30.0, headers=bearer_header(admin_key)) as client:
        response = await client.get(url)
    if response.status_code != 200:
        raise ConfigError(f"GET {url}: {response.status_code} {response.text[:300]}")
    body = response.json()
    views = [body] if tenant else body["data"]
    return sorted((v for v in views if v.get("budget_usd") is not None or tenant), key=lambda v: str(v["id"]))


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def budget_table(views: Sequence[dict[str, Any]]) -> str:
    """``views`` as an aligned text table, one row per tenant (USD to the cent; times in UTC; ``-`` for none)."""
    rows = [COLUMNS]
    for v in views:
        budget = v.get("budget_usd")
        spent = float(v.get("spent_usd", 0.0))
        rows.append((
            str(v["id"]),
            "-" if budget is None else f"{budget:.2f}",
            str(v.get("budget_period", "total")),
            f"{spent:.2f}",
            "-" if budget is None else f"{max(0.0, budget - spent):.2f}",
            _when(v.get("period_started_at")),
            _when(v.get("next_reset_at")),
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def budgets_command(
    tenant: Annotated[str | None, typer.Argument(help="One tenant's id; default: every tenant with a budget.")] = None,
    gateway: Annotated[str | None, typer.Option(help="Gateway base URL (default: GEARSHIFT_HOST:PORT).")] = None,
) -> None:
    """Show each tenant's budget, its period (total, daily, weekly, monthly), the current period's spend and the next
    reset."""
    from gearshift.cli.usage import local_gateway_url  # the command's module imports this one

    try:
        settings = GatewaySettings(allow_dev_secrets=True)  # a reader, not a server
        url = gateway or local_gateway_url(settings)
        views = asyncio.run(fetch_budgets(url, settings.admin_key.get_secret_value(), tenant=tenant))
    except (ConfigError, httpx.HTTPError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(budget_table(views))
