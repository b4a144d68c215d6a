"""``gearshift bench limits``: RPM, TPM, concurrency and budget admitted against their limits by two gateway
replicas on one Redis and on a Redis Cluster (``bench.limits``) → ``docs/benchmarks/limits.md``."""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

DEFAULT_OUT = Path("docs/benchmarks")


def limits(
    out: Annotated[Path, typer.Option(help="Directory for limits.md.")] = DEFAULT_OUT,
    store: Annotated[list[str] | None, typer.Option(help="redis and/or cluster (repeatable; default: both).")] = None,
    clients: Annotated[int, typer.Option(min=2, help="Concurrent clients per experiment.")] = 32,
) -> None:
    """Two gateway processes on one store: what each tenant limit admitted against the limit."""
    from bench.limits import LimitsBenchConfig, write

    stores = tuple(store or ("redis", "cluster"))
    if not set(stores) <= {"redis", "cluster"}:
        typer.echo("error: --store is redis or cluster", err=True)
        raise typer.Exit(2)
    config = LimitsBenchConfig(stores=stores, clients=clients)
    command = "gearshift bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    load = "Load average {:.1f} {:.1f} {:.1f} at the start".format(*os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="gearshift-limits-") as work:
        path = write(config, out, Path(work), command=command, load=load)
    typer.echo(f"wrote {path}")
