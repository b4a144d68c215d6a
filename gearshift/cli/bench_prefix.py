"""``gearshift bench prefix``: TTFT p50/p99 and $/Mtok of multi-turn agentic sessions with and without the gateway's
prefix affinity, in virtual time (``bench.prefix``) → ``docs/benchmarks/prefix.md`` + ``prefix.png``."""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

DEFAULT_OUT = Path("docs/benchmarks")


def prefix(
    out: Annotated[Path, typer.Option(help="Directory for prefix.md and prefix.png.")] = DEFAULT_OUT,
    sessions: Annotated[int, typer.Option(min=1, help="Concurrent sessions over the fleet.")] = 48,
    workers: Annotated[int, typer.Option(min=1, help="Simulated workers.")] = 4,
    duration: Annotated[float, typer.Option(min=1.0, help="Virtual seconds of load per arm.")] = 600.0,
    warmup: Annotated[float, typer.Option(min=0.0, help="Virtual seconds left out of the figures.")] = 120.0,
    sweep: Annotated[
        list[int] | None, typer.Option(help="Further session counts for the second table (repeatable; 0: none).")
    ] = None,
) -> None:
    """Multi-turn agentic sessions routed with the prefix scorer off, on, and on without its load bound."""
    from bench.prefix import PrefixBenchConfig, write

    if warmup >= duration:
        typer.echo("error: --warmup must be shorter than --duration", err=True)
        raise typer.Exit(2)
    config = PrefixBenchConfig(sessions=sessions, workers=workers, duration_s=duration, warmup_s=warmup)
    if sweep is not None:
        config = replace(config, sweep=tuple(n for n in sweep if n > 0))
    command = "gearshift bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    load = "load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())
    path = write(config, out, command=command, load=load)
    typer.echo(f"wrote {path}")
