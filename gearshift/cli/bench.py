"""``gearshift bench``: the evaluation lab's two commands (issue 6).

- ``gearshift bench policies``: every speculation policy on every scenario in virtual time →
  ``docs/benchmarks/policies.md`` + PNGs.
- ``gearshift bench gateway``: the gateway's cost against a fast fake upstream, side by side with a minimal
  pass-through proxy (and any ``--proxy-cmd``) → ``docs/benchmarks/gateway.md`` + PNGs.
"""

from __future__ import annotations

import shlex
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gearshift.cli import soak

bench_app = typer.Typer(help="Benchmarks and load checks: speculation policies in virtual time, the gateway's cost, …")
bench_app.command("soak")(soak.soak)
bench_app.command("fuzz")(soak.fuzz)
DEFAULT_OUT = Path("docs/benchmarks")


def _command_line() -> str:
    return "gearshift bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])


@bench_app.command("policies")
def policies(
    out: Annotated[Path, typer.Option(help="Directory for policies.md and its PNGs.")] = DEFAULT_OUT,
    scenario: Annotated[list[str] | None, typer.Option(help="Only these scenarios (repeatable).")] = None,
    scenario_dir: Annotated[Path | None, typer.Option(help="Scenario YAML directory (default: built-in).")] = None,
    scale: Annotated[float, typer.Option(min=0.001, help="Multiply every phase's duration (smoke runs).")] = 1.0,
    processes: Annotated[int, typer.Option(min=1, help="Worker processes running policies in parallel.")] = 2,
) -> None:
    """Compare static k, vLLM's batch-size table, a threshold gate, the controller and the oracle."""
    from bench.policy import report, targets
    from bench.policy.scenario import load_scenarios
    from bench.policy.suite import STATIC_KS, run_suite
    from fleet.config import ConfigError

    try:
        scenarios = load_scenarios(scenario_dir, scenario or None)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if scale != 1.0:
        scenarios = [s.scaled(scale) for s in scenarios]
    total = len(scenarios) * (len(STATIC_KS) + 4)
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as bar:  # fmt: skip
        task = bar.add_task("policy runs", total=total)
        result = run_suite(
            scenarios, processes=processes, progress=lambda m: bar.update(task, advance=1, description=m)
        )
    path = report.write(result, out, command=_command_line())
    passed = sum(c.met for c in targets.checks(result))
    console.print(f"wrote {path} ({passed}/{len(targets.checks(result))} target checks met)")


@bench_app.command("gateway")
def gateway(
    out: Annotated[Path, typer.Option(help="Directory for gateway.md and its PNGs.")] = DEFAULT_OUT,
    duration: Annotated[float, typer.Option(min=1, help="Seconds per wrk run.")] = 10.0,
    concurrency: Annotated[list[int] | None, typer.Option(help="Concurrency levels (repeatable).")] = None,
    proxy_cmd: Annotated[
        list[str] | None,
        typer.Option(help="Another proxy to compare: 'NAME=command … {port} … {upstream}' (repeatable)."),
    ] = None,
    no_gearshift: Annotated[bool, typer.Option(help="Leave the gearshift gateway out.")] = False,
    profile_seconds: Annotated[float, typer.Option(min=0, help="py-spy seconds per profiled proxy (0: off).")] = 8.0,
    ttfc_seconds: Annotated[float, typer.Option(min=0.5, help="Seconds of first-chunk sampling per target.")] = 3.0,
    repeat: Annotated[int, typer.Option(min=1, help="Interleaved rounds of every target; figures are medians.")] = 1,
    baseline: Annotated[
        str | None,
        typer.Option(help="Also run the gateway of this git revision (targets gearshift-*@REV), interleaved."),
    ] = None,
) -> None:
    """Measure the gateway's added latency and throughput against a fast fake upstream with wrk."""
    from bench.gateway import report as gw_report
    from bench.gateway.baseline import checkout
    from bench.gateway.gearshift_target import gearshift_launchers
    from bench.gateway.runner import GatewayBenchConfig, run
    from bench.gateway.targets import CommandLauncher, PassthroughLauncher, TargetLauncher

    launchers: list[TargetLauncher] = [PassthroughLauncher()]
    if not no_gearshift:
        launchers += gearshift_launchers()
    launchers += [CommandLauncher.parse(spec, i + 1) for i, spec in enumerate(proxy_cmd or [])]
    with ExitStack() as stack:
        if baseline is not None:
            tree = stack.enter_context(
                checkout(baseline, Path(tempfile.mkdtemp(prefix="gearshift-baseline-")) / "tree")
            )
            launchers += gearshift_launchers(tree, suffix=f"@{baseline}")
        config = GatewayBenchConfig(
            concurrencies=tuple(concurrency or (1, 16, 64)),
            duration_s=duration,
            warmup_s=min(2.0, duration),
            ttfc_duration_s=ttfc_seconds,
            profile_s=profile_seconds,
            repeat=repeat,
        )
        console = Console(stderr=True)
        with console.status("gateway bench") as status:
            result = run(launchers, config=config, progress=lambda m: status.update(f"gateway bench: {m}"))
    path = gw_report.write(result, out, command=_command_line())
    for failure in result.failures:
        console.print(f"[yellow]warning:[/] {failure}")
    console.print(f"wrote {path}")


def register(root: typer.Typer) -> None:
    """Add ``gearshift bench …`` to the root command."""
    root.add_typer(bench_app, name="bench")
