"""``gearshift bench chaos``: the fault matrix under load (``bench.chaos``), attached to the ``bench`` sub-app in
``gearshift.cli.bench``."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

DEFAULT_OUT = Path("docs/benchmarks")


def chaos(
    fast: Annotated[bool, typer.Option(help="The CI subset: five faults, shorter phases.")] = False,
    fault: Annotated[list[str] | None, typer.Option(help="Only these faults (repeatable).")] = None,
    before: Annotated[float | None, typer.Option(min=1, help="Seconds of load before each fault.")] = None,
    after: Annotated[float | None, typer.Option(min=1, help="Seconds of load after each fault is healed.")] = None,
    speedup: Annotated[float, typer.Option(min=0.01, help="Simulated seconds per real second.")] = 1.0,
    out: Annotated[Path, typer.Option(help="Directory for chaos.md.")] = DEFAULT_OUT,
    run_dir: Annotated[Path | None, typer.Option(help="Logs and config of the run (default: a temp dir).")] = None,
) -> None:
    """Two gateway replicas, a Redis Cluster, two controllers and four simulated workers under streaming load while
    faults are injected one at a time; fails unless the ledger matches the clients, no limit is over-admitted
    beyond its bound, no worker is left unroutable and every failure is clean."""
    from bench.chaos import report
    from bench.chaos.faults import FAST, by_name
    from bench.chaos.run import ChaosConfig, run_chaos

    console = Console(stderr=True)
    try:
        faults = by_name(fault or (list(FAST) if fast else None))
    except KeyError as exc:
        raise typer.BadParameter(str(exc.args[0]), param_hint="--fault") from None
    cfg = ChaosConfig(
        faults=tuple(faults),
        before_s=before if before is not None else (4.0 if fast else 8.0),
        after_s=after if after is not None else (5.0 if fast else 10.0),
        speedup=speedup,
        during_scale=0.6 if fast else 1.0,
    )
    directory = run_dir or Path(tempfile.mkdtemp(prefix="gearshift-chaos-"))
    result = asyncio.run(run_chaos(cfg, directory, progress=console.print))
    command = report.command_line(fast=fast, faults=fault or (), before=before, after=after, speedup=speedup, out=out)
    path = report.write(result, out, command=command)
    for check in report.checks(result):
        console.print(f"{'met    ' if check.met else 'NOT MET'}  {check.name}: {check.detail}")
    console.print(f"wrote {path}")
    if not all(c.met for c in report.checks(result)):
        raise typer.Exit(1)
