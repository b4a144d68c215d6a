"""``gearshift top``: a live terminal view of the fleet (rich).

Per worker: model, its pool in the fleet plan the gateway follows, k desired/applied (its gear; "free" marks a
worker restarted without its drafter, and the status shows "draining" or "restarting" during such a move),
accepted length, running/waiting, KV use, output tokens/s, $/Mtok and the controller's last decision reason, cut to
fit the terminal (``gearshift controller explain`` has it whole). Per tenant in force (the tenants file with the
changes made at run time through the admin API, read every frame): requests/s and the TPOT p99 of its tier
against the target.
Sources: each worker's ``/metrics`` (URLs from the fleet file), the gateway's ``/metrics``, and the worker
states the controller publishes — read from the store when ``GEARSHIFT_REDIS_URL`` is set, otherwise through
the gateway's admin API (which serves them from the store of a ``gearshift up`` process).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Protocol

import httpx
import typer
from rich import box
from rich.console import Console, ConsoleOptions, Group, JustifyMethod, RenderableType, RenderResult
from rich.live import Live
from rich.table import Table

from fleet.bearer import bearer_header
from fleet.config import ConfigError, FleetConfig, TenantConfig, TenantsConfig
from fleet.metric_labels import PLAIN, TenantLabeler
from fleet.scrape import WorkerScrape, parse_worker_metrics
from fleet.store.factory import build_store
from fleet.store.protocol import Store, WorkerState
from fleet.tenants import read_merged
from fleet.worker_mode import WorkerMode, read_modes
from gateway.settings import GatewaySettings
from gearshift.cli.top_model import (
    Snapshot,
    TenantRow,
    WorkerRow,
    WorkerSample,
    parse_gateway,
    tenant_rows,
    worker_rows,
)


class StateSource(Protocol):
    async def states(self) -> tuple[dict[str, WorkerState], dict[str, bool]]:
        """Published worker states by id, and the gateway's health view by id (may be empty)."""
        ...

    async def modes(self) -> dict[str, WorkerMode]:
        """The workers' drafter-free gear records by id (read with, or after, ``states``)."""
        ...

    async def tenants(self, file: TenantsConfig) -> TenantsConfig:
        """The tenants in force: ``file`` with the changes made at run time through the admin API."""
        ...


class StoreStates:
    """Worker states straight from the shared store (Redis)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def states(self) -> tuple[dict[str, WorkerState], dict[str, bool]]:
        return await self._store.worker_states(), {}

    async def modes(self) -> dict[str, WorkerMode]:
        return await read_modes(self._store)

    async def tenants(self, file: TenantsConfig) -> TenantsConfig:
        return (await read_merged(file, self._store)).tenants


class GatewayAdminStates:
    """Worker states and health through the gateway's ``GET /admin/v1/workers`` (admin key)."""

    def __init__(self, client: httpx.AsyncClient, gateway_url: str, admin_key: str) -> None:
        self._client, self._url, self._key = client, gateway_url.rstrip("/"), admin_key
        self._modes: dict[str, WorkerMode] = {}

    async def modes(self) -> dict[str, WorkerMode]:
        """The records the last ``states`` call read (the same admin response carries them)."""
        return self._modes

    async def states(self) -> tuple[dict[str, WorkerState], dict[str, bool]]:
        self._modes = {}
        try:
            response = await self._client.get(
                f"{self._url}/admin/v1/workers", headers={"authorization": f"Bearer {self._key}"}
            )
            response.raise_for_status()
        except httpx.HTTPError:
            return {}, {}
        rows: list[dict[str, Any]] = response.json()["data"]
        states = {r["id"]: WorkerState.model_validate(r["state"]) for r in rows if r.get("state")}
        self._modes = {r["id"]: WorkerMode.model_validate(r["mode"]) for r in rows if r.get("mode")}
        return states, {r["id"]: bool(r["healthy"]) for r in rows}

    async def tenants(self, file: TenantsConfig) -> TenantsConfig:
        """The gateway's tenants in force (``GET /admin/v1/tenants``: merged there), under ``file``'s tiers; the
        file's tenants while the gateway does not answer."""
        try:
            response = await self._client.get(
                f"{self._url}/admin/v1/tenants", headers={"authorization": f"Bearer {self._key}"}
            )
            response.raise_for_status()
        except httpx.HTTPError:
            return file
        rows: list[dict[str, Any]] = response.json()["data"]
        fields = TenantConfig.model_fields
        in_force = (TenantConfig.model_validate({k: v for k, v in r.items() if k in fields}) for r in rows)
        return TenantsConfig(tiers=file.tiers, tenants=tuple(t for t in in_force if t.tier in file.tiers))


async def _get_text(client: httpx.AsyncClient, url: str, headers: Mapping[str, str] | None = None) -> str | None:
    try:
        response = await client.get(url, headers=headers)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    return response.text


def _parse(text: str | None, *, at_s: float, model: str) -> WorkerScrape | None:
    """A worker's scrape, or None when it did not answer or answered something that is not an exposition."""
    if text is None:
        return None
    try:
        return parse_worker_metrics(text, at_s=at_s, model=model)
    except ValueError:
        return None


async def take_snapshot(
    client: httpx.AsyncClient,
    fleet: FleetConfig,
    gateway_url: str,
    source: StateSource,
    *,
    now: Callable[[], float] = time.monotonic,
    gateway_headers: Mapping[str, str] | None = None,
) -> Snapshot:
    """Read every worker's metrics, the gateway's metrics (with ``gateway_headers``: the metrics token's) and the
    published states, concurrently."""
    urls = [f"{w.url.rstrip('/')}/metrics" for w in fleet.workers]
    texts_task = asyncio.gather(*(_get_text(client, url) for url in urls))
    gateway_text, (states, healthy), texts = await asyncio.gather(
        _get_text(client, f"{gateway_url.rstrip('/')}/metrics", gateway_headers), source.states(), texts_task
    )
    at_s = now()
    modes = await source.modes()
    workers = {
        w.id: WorkerSample(
            worker_id=w.id,
            model=w.model,
            scrape=_parse(text, at_s=at_s, model=w.model),
            state=states.get(w.id),
            healthy=healthy.get(w.id),
            mode=modes.get(w.id),
        )
        for w, text in zip(fleet.workers, texts, strict=True)
    }
    gateway = parse_gateway(gateway_text) if gateway_text is not None else None
    return Snapshot(at_s=at_s, workers=workers, gateway=gateway)


# ---------------------------------------------------------------------------------------------- rendering
def _num(value: float | None, fmt: str, empty: str = "–") -> str:
    return empty if value is None else format(value, fmt)


def _ms(seconds: float | None, fmt: str) -> str:
    return "–" if seconds is None else f"{format(1000 * seconds, fmt)} ms"


def _k(row: WorkerRow) -> str:
    desired, applied = _num(row.k_desired, "d"), _num(row.k_applied, "d")
    mark = "" if row.k_desired is None or row.k_desired == row.k_applied else " [yellow]≠[/]"
    free = " [cyan]free[/]" if row.drafter_free else ""
    return f"{desired}/{applied}{mark}{free}"


WIDE_COLUMNS = 120
"""Terminal width from which the last decision is a column of the workers table; a narrower terminal gets the
decisions below the table, one line per worker. Either way a decision is cut to fit (an ellipsis marks it):
``gearshift controller explain`` prints it whole."""
_COLOURS = {
    "ok": "green",
    "down": "red",
    "unhealthy": "red",
    "stale": "yellow",
    "draining": "cyan",
    "restarting": "cyan",
}
_WORKER_COLUMNS: tuple[tuple[str, JustifyMethod], ...] = (
    ("worker", "left"), ("model", "left"), ("k des/app", "right"), ("acc len", "right"), ("run/wait", "right"),
    ("KV", "right"), ("tok/s", "right"), ("$/Mtok", "right"), ("status", "left"),
)  # fmt: skip


_POOL_COLUMN: tuple[str, JustifyMethod] = ("pool", "left")
"""The worker's pool in the fleet plan: a column after the model on a wide terminal, else before its decision."""


def _cells(r: WorkerRow, *, pool: bool) -> list[str]:
    return [
        r.worker_id,
        r.model,
        *([r.pool or "–"] if pool else []),
        _k(r),
        _num(r.accepted_length, ".2f"),
        f"{_num(r.running, '.0f')}/{_num(r.waiting, '.0f')}",
        _num(None if r.kv_usage is None else 100 * r.kv_usage, ".0f") + ("%" if r.kv_usage is not None else ""),
        _num(r.tokens_per_s, ",.0f"),
        _num(r.usd_per_mtok, ".2f"),
        f"[{_COLOURS.get(r.status, 'white')}]{r.status}[/]",
    ]


def workers_table(rows: list[WorkerRow], *, width: int) -> RenderableType:
    """The workers, laid out for a terminal ``width`` columns wide; no row wraps."""
    if width >= WIDE_COLUMNS:
        table = Table(title="workers", title_justify="left", expand=True)
        for name, justify in (*_WORKER_COLUMNS[:2], _POOL_COLUMN, *_WORKER_COLUMNS[2:]):
            table.add_column(name, justify=justify, no_wrap=True)
        table.add_column("last decision", no_wrap=True, overflow="ellipsis", ratio=1)
        for r in rows:
            table.add_row(*_cells(r, pool=True), r.reason)
        return table
    table = Table(
        title="workers", title_justify="left", expand=True, box=box.SIMPLE_HEAD, show_edge=False,
        collapse_padding=True, pad_edge=False,
    )  # fmt: skip
    for name, justify in _WORKER_COLUMNS:
        table.add_column(name, justify=justify, no_wrap=True, overflow="ellipsis")
    decisions = Table.grid(padding=(0, 2), expand=True)
    decisions.add_column(no_wrap=True)
    decisions.add_column(no_wrap=True, overflow="ellipsis", ratio=1)
    for r in rows:
        table.add_row(*_cells(r, pool=False))
        decisions.add_row(r.worker_id, f"{r.pool}: {r.reason}" if r.pool else r.reason)
    return Group(table, "last decisions", decisions)


class WorkersView:
    """The workers table, laid out when drawn, for the width the console has then (a resized terminal too)."""

    def __init__(self, rows: list[WorkerRow]) -> None:
        self.rows = rows

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield workers_table(self.rows, width=options.max_width)


def tenants_table(rows: list[TenantRow]) -> Table:
    table = Table(title="tenants", title_justify="left", expand=True)
    for name in ("tenant", "tier", "req/s", "TPOT p99", "target", "SLA"):
        justify: JustifyMethod = "left" if name in ("tenant", "tier", "SLA") else "right"
        table.add_column(name, justify=justify, no_wrap=True, overflow="ellipsis")
    for r in rows:
        met = None if r.tpot_p99_s is None or r.tpot_target_s is None else r.tpot_p99_s <= r.tpot_target_s
        sla = "–" if met is None else "[green]met[/]" if met else "[red]missed[/]"
        table.add_row(
            r.tenant,
            r.tier,
            _num(r.requests_per_s, ".2f"),
            _ms(r.tpot_p99_s, ".1f"),
            _ms(r.tpot_target_s, ".0f"),
            sla,
        )
    return table


def render(
    prev: Snapshot, cur: Snapshot, fleet: FleetConfig, tenants: TenantsConfig, label: TenantLabeler = PLAIN
) -> Group:
    window = cur.at_s - prev.at_s
    gateway = "gateway: unreachable" if cur.gateway is None else f"rates over the last {window:.1f} s"
    rows = tenant_rows(prev, cur, tenants, label)
    return Group(WorkersView(worker_rows(prev, cur, fleet)), tenants_table(rows), gateway)


# ------------------------------------------------------------------------------------------------ command
async def run_top(
    settings: GatewaySettings,
    *,
    gateway_url: str,
    interval_s: float,
    once: bool,
    console: Console,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Sample the fleet every ``interval_s`` seconds and draw it; with ``once``, draw one frame and return."""
    fleet, file, label = settings.fleet(), settings.tenants(), settings.tenant_labeler()
    token = settings.metrics_token
    headers = bearer_header(token.get_secret_value()) if token is not None else None
    snapshot = functools.partial(take_snapshot, gateway_headers=headers)
    store = build_store(settings) if settings.redis_url else None
    async with httpx.AsyncClient(timeout=httpx.Timeout(max(0.5, interval_s))) as client:
        source: StateSource = (
            StoreStates(store)
            if store is not None
            else GatewayAdminStates(client, gateway_url, settings.admin_key.get_secret_value())
        )
        try:
            prev = await snapshot(client, fleet, gateway_url, source)
            await sleep(interval_s)
            cur = await snapshot(client, fleet, gateway_url, source)
            tenants = await source.tenants(file)
            if once:
                console.print(render(prev, cur, fleet, tenants, label))
                return
            with Live(render(prev, cur, fleet, tenants, label), console=console, auto_refresh=False) as live:
                while True:
                    await sleep(interval_s)
                    prev, cur = cur, await snapshot(client, fleet, gateway_url, source)
                    tenants = await source.tenants(file)
                    live.update(render(prev, cur, fleet, tenants, label), refresh=True)
        finally:
            if store is not None:
                await store.close()


def top(
    gateway: Annotated[
        str | None, typer.Option("--gateway", help="Gateway base URL (default: GEARSHIFT_HOST and GEARSHIFT_PORT).")
    ] = None,
    interval: Annotated[float, typer.Option("--interval", min=0.1, help="Seconds between samples.")] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="Draw one frame (two samples) and exit.")] = False,
    width: Annotated[int | None, typer.Option("--width", min=60, help="Terminal width for --once output.")] = None,
    svg: Annotated[Path | None, typer.Option("--svg", help="With --once: also save the frame as an SVG image.")] = None,
) -> None:
    """Live view of the fleet: per worker k, acceptance, load, cost and decisions; per tenant rate and TPOT."""
    try:
        settings = GatewaySettings(allow_dev_secrets=True)  # a reader, not a server: the secrets guard is not for it
        url = gateway or f"http://{_loopback(settings.host)}:{settings.port}"
        console = Console(width=width, record=svg is not None)
        asyncio.run(run_top(settings, gateway_url=url, interval_s=interval, once=once, console=console))
        if svg is not None and once:
            console.save_svg(str(svg), title="gearshift top")
    except (ConfigError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    except KeyboardInterrupt:
        return


def _loopback(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


def register(root: typer.Typer) -> None:
    """Add ``gearshift top`` to the root command."""
    root.command("top")(top)
