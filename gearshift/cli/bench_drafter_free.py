"""``gearshift bench drafter-free``: the controller with and without the drafter-free gear on hours-long lab
scenarios where k = 0 is the best gear (``bench.policy.drafter_free_lab``) → ``docs/benchmarks/drafter-free.md``."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

DEFAULT_OUT = Path("docs/benchmarks")


def drafter_free(
    out: Annotated[Path, typer.Option(help="Directory for drafter-free.md.")] = DEFAULT_OUT,
    scenario: Annotated[list[str] | None, typer.Option(help="Only these scenarios (repeatable).")] = None,
    processes: Annotated[int, typer.Option(min=1, help="Runs in parallel (one process each).")] = 3,
) -> None:
    """Goodput of the controller with every worker keeping its drafter, with the drafter-free gear, and the bound
    of every worker drafter-free from the start, on the drafter-free scenarios (virtual time)."""
    from bench.policy.drafter_free_lab import write

    command = (
        "gearshift bench drafter-free " + shlex.join(sys.argv[3:])
        if len(sys.argv) > 3
        else "gearshift bench drafter-free"
    )
    path = write(out, names=scenario, command=command.strip(), processes=processes)
    Console(stderr=True).print(f"wrote {path}")
