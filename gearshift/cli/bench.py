"""``gearshift bench``: the evaluation lab's two commands (issue 6).

- ``gearshift bench policies``: every speculation policy on every scenario in virtual time, per profile
  (``--profile NAME`` repeatable, ``--profiles all``) → ``docs/benchmarks/policies.md``, ``policies.json`` + PNGs.
- ``gearshift bench gateway``: the gateway's cost against a fast fake upstream, side by side with a minimal
  pass-through proxy (and any ``--proxy-cmd``) → ``docs/benchmarks/gateway.md`` + PNGs.
- ``gearshift bench overload``: TTFT per tier under overload with and without the gateway's overload control →
  ``docs/benchmarks/overload.md``.
- ``gearshift bench limits``: RPM, TPM, concurrency and budget admitted against their limits by two gateway
  replicas on one Redis and on a Redis Cluster → ``docs/benchmarks/limits.md`` (``gearshift.cli.bench_limits``).
- ``gearshift bench prefix``: multi-turn agentic sessions with and without prefix affinity →
  ``docs/benchmarks/prefix.md`` + a PNG (``gearshift.cli.bench_prefix``).
- ``gearshift bench drafter-free``: the controller with and without the drafter-free gear on hours-long scenarios
  → ``docs/benchmarks/drafter-free.md`` (``gearshift.cli.bench_drafter_free``).
- ``gearshift bench chaos``: the fault matrix under load on real processes → ``docs/benchmarks/chaos.md``
  (``gearshift.cli.chaos``).
- ``gearshift bench robustness``: the controller with a wrong model (the workers run a perturbed or other profile)
  → ``docs/benchmarks/robustness.md``.
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

from bench.executor import EXECUTOR_HELP, EXECUTORS, make_executor
from gearshift.cli import bench_drafter_free, bench_limits, bench_prefix, chaos, replay, soak

bench_app = typer.Typer(help="Benchmarks and load checks: speculation policies in virtual time, the gateway's cost, …")
bench_app.command("soak")(soak.soak)
bench_app.command("fuzz")(soak.fuzz)
bench_app.command("chaos")(chaos.chaos)
bench_app.command("prefix")(bench_prefix.prefix)
bench_app.command("limits")(bench_limits.limits)
bench_app.command("drafter-free")(bench_drafter_free.drafter_free)
bench_app.command("replay")(replay.replay)
bench_app.command("replay-speed")(replay.replay_speed)
bench_app.command("replay-check")(replay.replay_check)
bench_app.command("drive")(replay.drive)
DEFAULT_OUT = Path("docs/benchmarks")


def _command_line() -> str:
    return "gearshift bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])


@bench_app.command("policies")
def policies(
    out: Annotated[Path, typer.Option(help="Directory for policies.md, policies.json and the PNGs.")] = DEFAULT_OUT,
    scenario: Annotated[list[str] | None, typer.Option(help="Only these scenarios (repeatable).")] = None,
    scenario_dir: Annotated[Path | None, typer.Option(help="Scenario YAML directory (default: built-in).")] = None,
    profile: Annotated[
        list[str] | None, typer.Option(help="Run on this profile (repeatable; default: each scenario's own).")
    ] = None,
    profiles: Annotated[str | None, typer.Option(help="'all': every profile of the family (fleet/profiles).")] = None,
    scale: Annotated[float, typer.Option(min=0.001, help="Multiply every phase's duration (smoke runs).")] = 1.0,
    processes: Annotated[int, typer.Option(min=1, help="Worker processes running policies in parallel.")] = 2,
    executor: Annotated[str, typer.Option(help=EXECUTOR_HELP)] = "local",
    remeasure: Annotated[
        bool, typer.Option(help="Measure every capacity again instead of reading policies-capacity.json.")
    ] = False,
    idle_drafter: Annotated[
        str,
        typer.Option(
            help="The k = 0 tax the workers pay, and the controller believes: 'stock' (vLLM's own, the profile's "
            "k0_tax) or 'plugin' (the gearshift plugin's idle-drafter skip, k0_tax_plugin). Use another --out."
        ),
    ] = "stock",
) -> None:
    """Compare static k, vLLM's batch-size table, a threshold gate, every lab policy and the oracle, per profile."""
    from bench.policy import report, targets
    from bench.policy.load import CapacityCache
    from bench.policy.scenario import load_scenarios
    from bench.policy.suite import family_profiles, run_family
    from fleet.config import ConfigError
    from fleet.perf import IdleDrafterMode, load_profile

    try:
        mode = IdleDrafterMode(idle_drafter) if idle_drafter in set(IdleDrafterMode) else None
        if mode is None:
            raise ConfigError(f"--idle-drafter: 'stock' or 'plugin', got {idle_drafter!r}")
        scenarios = load_scenarios(scenario_dir, scenario or None)
        if executor not in EXECUTORS:
            raise ConfigError(f"--executor: one of {', '.join(EXECUTORS)}, got {executor!r}")
        if profiles is not None and profiles != "all":
            raise ConfigError(f"--profiles: only 'all' is accepted, got {profiles!r}; name one with --profile")
        names = family_profiles() if profiles == "all" else (profile or sorted({s.profile for s in scenarios}))
        family = [load_profile(n).with_idle_drafter(mode) for n in names]
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if scale != 1.0:
        scenarios = [s.scaled(scale) for s in scenarios]
    console = Console(stderr=True)
    cache_path = out / "policies-capacity.json"
    cache = CapacityCache(cache_path) if remeasure else CapacityCache.open(cache_path)
    done = 0

    def progress(message: str) -> None:
        nonlocal done
        done += 1
        if console.is_terminal:
            status.update(f"policy runs: {done} done, {message}")
        else:
            console.print(f"{done} {message}")

    with console.status("policy runs") as status, make_executor(executor, processes=processes) as pool:
        results = run_family(family, scenarios, progress=progress, capacity_cache=cache, executor=pool)
    path = report.write(results, out, command=_command_line())
    for name, result in results.items():
        mine = targets.checks(result)
        console.print(f"{name}: {sum(c.met for c in mine)}/{len(mine)} target checks met")
    console.print(f"wrote {path}")


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
            concurrencies=tuple(concurrency or GatewayBenchConfig.concurrencies),
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


@bench_app.command("overload")
def overload(
    out: Annotated[Path, typer.Option(help="Directory for overload.md.")] = DEFAULT_OUT,
    duration: Annotated[float, typer.Option(min=1, help="Seconds of arrivals per run.")] = 30.0,
    factor: Annotated[float, typer.Option(min=0.1, help="Offered load as a multiple of the worker's capacity.")] = 1.5,
) -> None:
    """TTFT p50/p99 per tier under overload, with and without the gateway's overload control."""
    from bench.overload import OverloadBenchConfig, write

    path = write(OverloadBenchConfig(duration_s=duration, overload=factor), out, command=_command_line())
    Console(stderr=True).print(f"wrote {path}")


@bench_app.command("robustness")
def robustness(
    out: Annotated[Path, typer.Option(help="Directory for robustness.md.")] = DEFAULT_OUT,
    scenario: Annotated[
        list[str] | None, typer.Option(help="Scenarios every cell runs (repeatable; default: phase-shift, straddle).")
    ] = None,
    scenario_dir: Annotated[Path | None, typer.Option(help="Scenario YAML directory (default: built-in).")] = None,
    profile: Annotated[
        list[str] | None, typer.Option(help="Believed profiles (repeatable; default: the whole family).")
    ] = None,
    scale: Annotated[float, typer.Option(min=0.001, help="Multiply every phase's duration (smoke runs).")] = 1.0,
    processes: Annotated[int, typer.Option(min=1, help="Worker processes running cells in parallel.")] = 2,
    executor: Annotated[str, typer.Option(help=EXECUTOR_HELP)] = "local",
) -> None:
    """Goodput lost when the controller believes one profile and the workers run another, per cell of the grid."""
    from bench.policy import robustness as grid
    from bench.policy.scenario import load_scenarios
    from bench.policy.suite import family_profiles
    from fleet.config import ConfigError

    try:
        if executor not in EXECUTORS:
            raise ConfigError(f"--executor: one of {', '.join(EXECUTORS)}, got {executor!r}")
        chosen = load_scenarios(scenario_dir, scenario or list(grid.DEFAULT_SCENARIOS))
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if scale != 1.0:
        chosen = [s.scaled(scale) for s in chosen]
    cells = [c for c in grid.grid(family_profiles()) if profile is None or c.believed in profile]
    console = Console(stderr=True)
    with console.status("robustness cells") as status, make_executor(executor, processes=processes) as pool:
        results = grid.run_grid(cells, chosen, progress=lambda m: status.update(f"cells: {m}"), executor=pool)
    path = grid.write(results, out, command=_command_line())
    console.print(f"{sum(r.met for r in results)}/{len(results)} cells within {grid.TARGET_LOSS:.0%}; wrote {path}")


def register(root: typer.Typer) -> None:
    """Add ``gearshift bench …`` to the root command."""
    root.add_typer(bench_app, name="bench")
