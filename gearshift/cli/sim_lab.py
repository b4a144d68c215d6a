"""``gearshift sim figures`` and ``gearshift sim bench``: the simulator's calibration and its speed.

``gearshift.cli.sim`` registers both on the ``sim`` sub-app.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from bench.policy.virtual_speed import TARGET_RATIO, best_of
from fleet.config import ConfigError
from fleet.perf import Profile, load_profile
from workers.sim.arrivals import Lengths, WorkloadMix
from workers.sim.crossover import BEST_K_CONTEXT_TOKENS, best_k_rows, crossover_rows
from workers.sim.figures import GENERAL_MIX, FigureResult, simulate_figures

ProfileOption = Annotated[
    str, typer.Option("--profile", help="Profile name (fleet/profiles/<name>.yaml) or path to a profile YAML.")
]


def _console() -> Console:
    """A console that does not squeeze the tables to 80 columns when the output is not a terminal."""
    console = Console()
    return console if console.is_terminal else Console(width=150)


def _profile(name: str) -> Profile:
    try:
        return load_profile(name)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--profile") from exc


def figures_command(
    profile: ProfileOption = "kimi-k3-dspark-tp16",
    seed: Annotated[int, typer.Option(help="Seed of the virtual-time runs.")] = 1,
    crossover: Annotated[
        bool,
        typer.Option(
            "--crossover", help="Also print where k_max stops paying and the best k, by batch size (analytic)."
        ),
    ] = False,
) -> None:
    """Re-run every figure of the profile's own figures file in virtual time; exit 1 if any asserted one misses
    its tolerance (figures marked reported are shown, never failed)."""
    prof = _profile(profile)
    console = _console()
    try:
        results = simulate_figures(prof, seed=seed)
    except (ConfigError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--profile") from exc
    table = Table(title=f"Calibration of {prof.name} against {prof.figures}")
    for col in ("figure", "role", "unit", "published", "simulated", "error", "tolerance", "result"):
        table.add_column(col, justify="left" if col in ("figure", "role", "unit") else "right")
    for r in results:
        tolerance = "—" if r.tolerance is None else f"±{r.tolerance:.0%}"
        table.add_row(
            r.figure,
            r.role,
            r.unit,
            f"{r.published:g}",
            f"{r.simulated:.2f}",
            f"{r.error:+.1%}",
            tolerance,
            _verdict(r),
        )
    fitted = sum(r.role == "fitted" and r.asserted for r in results)
    predicted = [r for r in results if r.role == "predicted" and r.asserted]
    console.print(
        f"{fitted} fitted figures (they confirm the fit), {len(predicted)} predicted "
        f"({sum(bool(r.passed) for r in predicted)} within tolerance: the checks that test the model)"
    )
    console.print(table)
    if crossover:
        _print_crossover(console, prof)
    if any(r.passed is False for r in results):
        raise typer.Exit(1)


def _verdict(result: FigureResult) -> str:
    if result.passed is None:
        return "[yellow]reported, not asserted[/yellow]"
    return "[green]PASS[/green]" if result.passed else "[red]FAIL[/red]"


def _batch_header(batch: int, max_num_seqs: int) -> str:
    return str(batch) if batch <= max_num_seqs else f"{batch}*"


def _print_crossover(console: Console, profile: Profile) -> None:
    mixes = {"general mix": GENERAL_MIX}
    mixes.update({w: WorkloadMix.single(w, Lengths(1000), Lengths(500)) for w in profile.acceptance})
    k_max, seqs = profile.drafter.k_max, profile.serving.max_num_seqs
    beyond = f"* beyond this profile's max_num_seqs ({seqs}): needs a larger --max-num-seqs"
    rows = crossover_rows(profile, mixes, k=k_max)
    table = Table(
        title=f"Per-user speed-up of k={k_max} over k=0 by decode batch (context 2 000 tokens)", caption=beyond
    )
    table.add_column("workload")
    table.add_column("tokens/step", justify="right")
    for b in rows[0].batches:
        table.add_column(_batch_header(b, seqs), justify="right")
    table.add_column(f"k={k_max} loses from", justify="right")
    for row in rows:
        cells = [f"{s:.2f}" for s in row.speedups]
        loses = "never" if row.loses_from is None else str(row.loses_from)
        table.add_row(row.name, f"{row.tokens_per_step:.2f}", *cells, loses)
    console.print(table)
    best = best_k_rows(profile, mixes)
    most = profile.hardware.kv_capacity_tokens // BEST_K_CONTEXT_TOKENS
    table = Table(
        title=f"Best k × its gain over k=0, by decode batch (context {BEST_K_CONTEXT_TOKENS} tokens)",
        caption=f"KV capacity admits at most {most} sequences of this context per worker; {beyond}",
    )
    table.add_column("workload")
    for b in best[0].batches:
        table.add_column(_batch_header(b, seqs), justify="right")
    table.add_column("k=0 from", justify="right")
    for brow in best:
        cells = [f"{k}×{g:.2f}" for k, g in zip(brow.best_k, brow.gains, strict=True)]
        table.add_row(brow.name, *cells, "never" if brow.off_from is None else str(brow.off_from))
    console.print(table)


def bench_command(
    profile: ProfileOption = "kimi-k3-dspark-tp16",
    workers: Annotated[int, typer.Option(min=1, help="Simulated workers.")] = 8,
    streams: Annotated[int, typer.Option(min=1, help="Closed-loop streams per worker.")] = 32,
    seconds: Annotated[float, typer.Option(min=1.0, help="Virtual seconds to simulate.")] = 120.0,
    k: Annotated[
        int | None, typer.Option(min=0, help="Draft length of every worker (default: the profile's k_max).")
    ] = None,
    scrape_every: Annotated[
        float, typer.Option(min=0.0, help="Render every worker's /metrics each this many virtual seconds (0: never).")
    ] = 0.0,
    repeat: Annotated[int, typer.Option(min=1, help="Runs; the fastest is reported.")] = 3,
) -> None:
    """Measure how many simulated seconds the virtual-time lab runs per wall-clock second; exit 1 below 100."""
    prof = _profile(profile)
    k = prof.drafter.k_max if k is None else k
    result = best_of(
        repeat,
        prof,
        workers=workers,
        streams_per_worker=streams,
        simulated_s=seconds,
        k=k,
        scrape_every_s=scrape_every or None,
    )
    console = _console()
    console.print(
        f"{result.workers} workers × {result.streams_per_worker} streams, k={k}: "
        f"{result.simulated_s:g} simulated s in {result.wall_s:.2f} wall s, "
        f"{result.steps} engine steps, {result.output_tokens} output tokens, "
        f"{result.finished_requests} requests finished, {result.scrapes} scrapes"
    )
    verdict = "[green]PASS[/green]" if result.passed else "[red]FAIL[/red]"
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    console.print(
        f"speed: {result.ratio:.0f}× real time (target ≥ {TARGET_RATIO:.0f}×) {verdict}; "
        f"{result.cpu_ratio:.0f}× per CPU second of this process (load average {load}; best of {repeat})"
    )
    if not result.passed:
        raise typer.Exit(1)
