"""``gearshift worker drain``: the shutdown drain of one worker (``fleet.drain``), for a pod's preStop hook."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import httpx
import typer
from redis.exceptions import RedisError

from fleet.clock import SystemClock
from fleet.config import CommonSettings, ConfigError, load_fleet
from fleet.drain import DrainOutcome, begin_shutdown_drain, wait_drained
from fleet.scrape import parse_worker_metrics
from fleet.store.factory import build_store


def drain_command(
    worker_id: Annotated[str, typer.Option("--worker-id", help="Worker id in the fleet file.")],
    fleet_file: Annotated[
        Path | None, typer.Option("--fleet-file", help="Fleet YAML (default: GEARSHIFT_FLEET_FILE or the built-in).")
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0, help="Longest wait for the in-flight requests, seconds.")
    ] = 540.0,
    metrics_url: Annotated[
        str | None,
        typer.Option("--metrics-url", help="The worker's /metrics (default: loopback on its fleet URL's port)."),
    ] = None,
) -> None:
    """Mark the worker draining in the store (no gateway sends it new requests), then wait until it runs nothing.
    Exits 0 when drained, 1 when the timeout passed first (the caller stops the worker anyway)."""
    try:
        common = CommonSettings()
        worker = load_fleet(fleet_file or common.fleet_file).worker(worker_id)
        if worker is None:
            raise ConfigError(f"--worker-id: no worker {worker_id!r} in the fleet file")
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    url = metrics_url or f"http://127.0.0.1:{urlsplit(worker.url).port or 80}/metrics"
    outcome = asyncio.run(_drain(common, worker_id, url, timeout))
    left = "unknown" if outcome.in_flight is None else str(outcome.in_flight)
    typer.echo(f"worker {worker_id}: drained={outcome.drained} after {outcome.waited_s:.0f} s, in flight: {left}")
    if not outcome.drained:
        raise typer.Exit(1)


async def _drain(common: CommonSettings, worker_id: str, metrics_url: str, timeout_s: float) -> DrainOutcome:
    clock = SystemClock()
    store = build_store(common, clock=clock)
    try:
        await begin_shutdown_drain(store, worker_id, clock=clock)
    except (RedisError, OSError) as exc:  # the requests in flight still get their time to finish
        typer.echo(f"warning: worker {worker_id}: could not mark it draining in the store ({exc})", err=True)
    finally:
        await store.close()
    async with httpx.AsyncClient(timeout=5.0) as client:

        async def in_flight() -> int | None:
            try:
                response = await client.get(metrics_url)
                response.raise_for_status()
            except httpx.HTTPError:
                return None
            scrape = parse_worker_metrics(response.text)
            return int(scrape.running + scrape.waiting)

        return await wait_drained(in_flight, clock=clock, timeout_s=timeout_s)
