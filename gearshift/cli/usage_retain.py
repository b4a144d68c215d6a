"""``gearshift usage retain``: ledger retention by age and size (``fleet.store.retention``), exporting what it trims
first when ``--export-dir`` is given. Run it on a schedule (deploy/kubernetes/base/ledger-retention.yaml)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from fleet.config import CommonSettings
from fleet.store.factory import build_store
from fleet.store.ledger_export import ExportDirectory
from fleet.store.retention import RetentionPolicy, RetentionReport, retain

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds from ``<N>`` or ``<N>s|m|h|d``."""
    unit = _UNITS.get(text[-1:])
    number = text[:-1] if unit is not None else text
    try:
        return float(number) * (unit or 1)
    except ValueError:
        raise typer.BadParameter(f"not a duration (<N>s/m/h/d): {text!r}") from None


def retain_command(
    max_age: Annotated[str | None, typer.Option("--max-age", help="Trim records older than this (e.g. 90d).")] = None,
    max_records: Annotated[
        int | None, typer.Option("--max-records", min=1, help="Keep at most this many records per tenant.")
    ] = None,
    export_dir: Annotated[
        Path | None,
        typer.Option("--export-dir", help="Write what is trimmed here first (JSON lines per tenant, replayable)."),
    ] = None,
) -> None:
    """Trim each tenant's usage ledger in the store (GEARSHIFT_REDIS_URL) to the bounds, after exporting the trimmed
    records to --export-dir when given. Spend counters (budgets) are not touched."""
    try:
        policy = RetentionPolicy(
            max_age_s=parse_duration(max_age) if max_age is not None else None, max_records=max_records
        )
    except ValidationError as exc:
        typer.echo(f"error: {exc.errors()[0]['msg']}", err=True)
        raise typer.Exit(2) from exc
    settings = CommonSettings()
    if not settings.redis_url:
        typer.echo("error: GEARSHIFT_REDIS_URL is not set: the embedded in-memory ledger keeps no history", err=True)
        raise typer.Exit(2)
    report, recovered = asyncio.run(_run(settings, policy, export_dir))
    if recovered != (0, 0):
        typer.echo(f"settled pages of an earlier run: {recovered[0]} committed, {recovered[1]} discarded", err=True)
    for tenant, n in sorted(report.trimmed.items()):
        typer.echo(f"{tenant}: trimmed {n} records" + (f" (exported to {export_dir})" if export_dir else ""))
    if report.skipped:
        typer.echo(f"left for the next run (records kept arriving under the cut): {report.skipped}", err=True)
        raise typer.Exit(1)


async def _run(
    settings: CommonSettings, policy: RetentionPolicy, export_dir: Path | None
) -> tuple[RetentionReport, tuple[int, int]]:
    store = build_store(settings)
    try:
        sink = ExportDirectory(export_dir) if export_dir is not None else None
        recovered = await sink.recover(store) if sink is not None else (0, 0)
        return await retain(store, policy, now=time.time(), sink=sink), recovered
    finally:
        await store.close()
