"""``gearshift bench soak`` and ``gearshift bench fuzz``: the reliability lab's two long-running commands
(issue 8), attached to the ``bench`` sub-app by ``register``."""

from __future__ import annotations

import asyncio
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

DEFAULT_OUT = Path("docs/benchmarks")


def _command_line() -> str:
    return "gearshift bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])


def soak(
    clients: Annotated[int, typer.Option(min=1, help="Concurrent streaming clients.")] = 200,
    duration: Annotated[float, typer.Option(min=1, help="Seconds of load.")] = 600.0,
    warmup: Annotated[float, typer.Option(min=0, help="Seconds before RSS growth is measured.")] = 60.0,
    sample: Annotated[float, typer.Option(min=0.5, help="Seconds between progress samples.")] = 10.0,
    workers: Annotated[int, typer.Option(min=1, help="Simulated worker processes.")] = 4,
    replicas: Annotated[int, typer.Option(min=1, help="Gateway processes.")] = 2,
    speedup: Annotated[float, typer.Option(min=0.01, help="Simulated seconds per real second.")] = 1.0,
    max_tokens: Annotated[int, typer.Option(min=2, help="Longest completion, tokens.")] = 128,
    seed: Annotated[int, typer.Option(help="Seed of the clients' choices.")] = 0,
    out: Annotated[Path, typer.Option(help="Directory for soak.md.")] = DEFAULT_OUT,
    run_dir: Annotated[Path | None, typer.Option(help="Logs and config of the run (default: a temp dir).")] = None,
) -> None:
    """Two gateway replicas on Redis in front of simulated workers under N streaming clients; checks that only
    intended 429s occur, RSS stays flat, connections return to their start, and the ledger equals the clients."""
    from bench.soak import report as soak_report
    from bench.soak.run import Sample, SoakConfig, run_soak

    cfg = SoakConfig(
        clients=clients, duration_s=duration, warmup_s=min(warmup, duration / 2), sample_s=sample, workers=workers,
        replicas=replicas, speedup=speedup, max_tokens=max_tokens, min_tokens=min(16, max_tokens), seed=seed,
    )  # fmt: skip
    console = Console(stderr=True)

    def progress(s: Sample) -> None:
        rss = " / ".join(f"{r:.0f}" for r in s.rss_mib)
        console.print(f"t={s.at_s:6.0f} s  served {s.served:7d}  errors {s.errors:5d}  RSS MiB {rss}  "
                      f"connections {s.connections}")  # fmt: skip

    directory = run_dir or Path(tempfile.mkdtemp(prefix="gearshift-soak-"))
    console.print(f"soak: logs in {directory}")
    result = asyncio.run(run_soak(cfg, directory, progress=progress))
    path = soak_report.write(result, out, command=_command_line())
    for line in soak_report.summary_lines(result):
        console.print(line)
    console.print(f"wrote {path}")
    if not all(c.met for c in soak_report.checks(result)):
        raise typer.Exit(1)


def fuzz(
    max_examples: Annotated[int, typer.Option(min=1, help="Hypothesis examples per API operation.")] = 200,
    body_examples: Annotated[int, typer.Option(min=1, help="Examples of hostile completion bodies.")] = 1000,
    seed: Annotated[int | None, typer.Option(help="Hypothesis seed (default: random).")] = None,
) -> None:
    """Fuzz a gateway (in front of a simulated worker) from its OpenAPI schema and with hostile completion
    bodies; fails on any 5xx or any response that breaks the schema or the OpenAI error shape."""
    from bench.soak.fuzz import run_fuzz

    console = Console(stderr=True)
    report = run_fuzz(max_examples=max_examples, body_examples=body_examples, seed=seed, log=console.print)
    for line in report.lines():
        console.print(line)
    if report.failures:
        raise typer.Exit(1)
