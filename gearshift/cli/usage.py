"""``gearshift usage export``: the gateway's usage ledger as JSON lines (one ``UsageRecord`` per line, time order),
the trace format ``gearshift bench replay`` reads.

With ``GEARSHIFT_REDIS_URL`` set it reads the store directly (a single Redis or, with ``GEARSHIFT_REDIS_CLUSTER``,
a cluster); otherwise it asks the gateway's admin API (``GET /admin/v1/ledger``), which is how the embedded
stack's in-memory ledger is read. Records come a page at a time; repeated request ids at a page boundary are
dropped, so every record is written once.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, TextIO

import httpx
import typer

from fleet.bearer import bearer_header
from fleet.config import CommonSettings, ConfigError
from fleet.store.factory import build_store
from fleet.store.protocol import UsageRecord
from gateway.settings import GatewaySettings
from gearshift.cli.usage_budgets import budgets_command
from gearshift.cli.usage_retain import retain_command

PAGE = 1000
usage_app = typer.Typer(help="The usage ledger: export it as a replay trace, trim it to its retention, show budgets.")
usage_app.command("retain")(retain_command)
usage_app.command("budgets")(budgets_command)

Fetch = Callable[[float, float, int], Awaitable[list[UsageRecord]]]
"""(since, until, limit) → the first ``limit`` records in time order."""


def parse_time(text: str | None, *, now: float) -> float | None:
    """Unix seconds from seconds, an ISO date-time (naive ones are UTC), or ``-<N>s|m|h|d`` (ago)."""
    if text is None:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text.startswith("-") and text[-1:] in units and text[1:-1].replace(".", "", 1).isdigit():
        return now - float(text[1:-1]) * units[text[-1]]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"not seconds, an ISO date-time or -<N>s/m/h/d: {text!r}") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


async def pages(fetch: Fetch, since: float, until: float, *, page_size: int = PAGE) -> AsyncIterator[UsageRecord]:
    """Every record of ``[since, until)`` once, a page at a time. The next page starts at the last record's
    time, so records at that instant come again and are dropped by id; a page holding nothing new (more records
    at one instant than a page) is fetched again twice as large."""
    seen: set[str] = set()
    size = page_size
    while True:
        page = await fetch(since, until, size)
        fresh = [r for r in page if r.request_id not in seen]
        for r in fresh:
            yield r
        if len(page) < size:
            return
        boundary = page[-1].at
        at_boundary = {r.request_id for r in page if r.at == boundary}
        seen = seen | at_boundary if boundary == since else at_boundary
        size = size if fresh else size * 2
        since = boundary


async def export(
    out: TextIO,
    *,
    since: float,
    until: float,
    settings: CommonSettings,
    gateway_url: str,
    admin_key: str,
    page_size: int = PAGE,
) -> int:
    """Write every record with ``since <= at < until`` to ``out``; return how many."""
    n = 0
    if settings.redis_url:
        store = build_store(settings)
        try:

            async def from_store(a: float, b: float, limit: int) -> list[UsageRecord]:
                return await store.ledger(since=a, until=b, limit=limit)

            async for record in pages(from_store, since, until, page_size=page_size):
                out.write(record.model_dump_json() + "\n")
                n += 1
        finally:
            await store.close()
        return n
    async with httpx.AsyncClient(timeout=30.0, headers=bearer_header(admin_key)) as client:

        async def from_gateway(a: float, b: float, limit: int) -> list[UsageRecord]:
            url = f"{gateway_url.rstrip('/')}/admin/v1/ledger"
            response = await client.get(url, params={"since": a, "until": b, "limit": limit})
            if response.status_code != 200:
                raise ConfigError(f"GET {url}: {response.status_code} {response.text[:300]}")
            return [UsageRecord.model_validate(r) for r in response.json()["data"]]

        async for record in pages(from_gateway, since, until, page_size=page_size):
            out.write(record.model_dump_json() + "\n")
            n += 1
    return n


def local_gateway_url(settings: GatewaySettings | None = None) -> str:
    """The gateway this machine runs (``GEARSHIFT_HOST`` and ``GEARSHIFT_PORT``, a wildcard host as loopback)."""
    settings = settings or GatewaySettings(allow_dev_secrets=True)
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "") else settings.host
    return f"http://{host}:{settings.port}"


@usage_app.command("export")
def export_command(
    since: Annotated[str | None, typer.Option(help="From (Unix s, ISO date-time, or -1h); default: the start.")] = None,
    until: Annotated[str | None, typer.Option(help="Until (exclusive); default: now.")] = None,
    gateway: Annotated[
        str | None, typer.Option(help="Gateway base URL when no GEARSHIFT_REDIS_URL (default: GEARSHIFT_HOST:PORT).")
    ] = None,
) -> None:
    """Write the ledger's records as JSON lines on standard output (``> trace.jsonl``), in time order."""
    try:
        settings = GatewaySettings(allow_dev_secrets=True)  # a reader, not a server
        now = datetime.now(UTC).timestamp()
        start = parse_time(since, now=now) or 0.0
        end = parse_time(until, now=now) or now + 1e-6
        url = gateway or local_gateway_url(settings)
        n = asyncio.run(
            export(
                sys.stdout,
                since=start,
                until=end,
                settings=settings,
                gateway_url=url,
                admin_key=settings.admin_key.get_secret_value(),
            )
        )
    except (ConfigError, httpx.HTTPError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"exported {n} records", err=True)


def register(root: typer.Typer) -> None:
    """Add ``gearshift usage …`` to the root command."""
    root.add_typer(usage_app, name="usage")
