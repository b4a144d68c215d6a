"""``gearshift gateway``: the gateway, settings from ``GEARSHIFT_*`` and the fleet/tenants files; ``--workers N`` runs
N processes on one port (``gearshift.cli.gateway_workers``)."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import typer
import uvloop

from fleet.clock import SystemClock
from fleet.config import ConfigError
from fleet.store.factory import build_store
from gateway.http.serve import GatewayServer
from gateway.settings import GatewaySettings
from gateway.wiring import GatewayDeps


async def serve(settings: GatewaySettings, *, reuse_port: bool = False) -> None:
    """Run the gateway until interrupted; the store is closed on the way out."""
    clock = SystemClock()
    store = build_store(settings, clock=clock)
    try:
        server = GatewayServer(GatewayDeps.from_settings(settings, store=store, clock=clock), reuse_port=reuse_port)
        await server.start()
        logging.getLogger("gearshift.gateway").info("gateway listening on %s", server.url)
        await server.wait()
    finally:
        await store.close()


def run(
    host: Annotated[str | None, typer.Option("--host", help="Listen address (GEARSHIFT_HOST).")] = None,
    port: Annotated[int | None, typer.Option("--port", help="Listen port (GEARSHIFT_PORT); 0 picks one.")] = None,
    workers: Annotated[
        int,
        typer.Option(
            "--workers", min=1, help="Gateway processes on the one port (SO_REUSEPORT); more than 1 needs Redis."
        ),
    ] = 1,
) -> None:
    """Run the OpenAI-compatible gateway in front of the fleet file's workers."""
    try:
        overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
        settings = GatewaySettings(**overrides)  # type: ignore[arg-type]
        settings.fleet()
        settings.tenants()
    except (ConfigError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if workers > 1:
        from gearshift.cli.gateway_workers import WorkersRefused, serve_workers

        try:
            raise typer.Exit(serve_workers(settings, overrides, workers=workers))
        except WorkersRefused as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(settings))


def register(root: typer.Typer) -> None:
    """Add ``gearshift gateway`` to the root command."""
    root.command("gateway")(run)
