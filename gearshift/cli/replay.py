"""``gearshift bench replay TRACE``: what each policy would have given on a recorded trace (``bench.replay``), and
``gearshift bench replay-speed``: how fast the lab replays (simulated seconds per wall second)."""

from __future__ import annotations

import functools
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from bench.executor import EXECUTOR_HELP, EXECUTORS, make_executor

DEFAULT_OUT = Path("docs/benchmarks")


def _parse_class_map(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        tenant, sep, cls = item.partition("=")
        if not sep or not tenant or not cls:
            raise typer.BadParameter(f"--class-map: expected TENANT=CLASS, got {item!r}")
        out[tenant] = cls
    return out


def replay(
    trace: Annotated[
        Path,
        typer.Argument(
            help="Trace file: a ledger export, an Azure/BurstGPT/Mooncake trace, or a CSV/JSONL with named columns."
        ),
    ],
    profile: Annotated[
        str, typer.Option(help="Worker profile: a built-in name or a YAML file (gearshift profile).")
    ] = "kimi-k3-dspark-tp16",
    workers: Annotated[
        str,
        typer.Option(help="Workers in the fleet, or 'auto': the smallest fleet meeting every tier's SLA, per policy."),
    ] = "2",
    tenants: Annotated[
        Path | None, typer.Option(help="The gateway's tenants file (tiers and each tenant's tier).")
    ] = None,
    class_map: Annotated[
        list[str] | None,
        typer.Option(
            help="TENANT=CLASS: the acceptance class of a tenant's requests without a workload hint (repeatable)."
        ),
    ] = None,
    acceptance_from_store: Annotated[
        str | None,
        typer.Option(
            help="Redis URL: run each tenant as the acceptance class closest to what the controller measured on "
            "the workers that served it."
        ),
    ] = None,
    speed: Annotated[float, typer.Option(min=1e-6, help="Compress time: arrivals divided by this factor.")] = 1.0,
    duration: Annotated[
        float | None, typer.Option(min=1.0, help="Cut the trace after this many seconds (after --speed).")
    ] = None,
    phase: Annotated[
        float, typer.Option(min=1.0, help="Phase window, seconds (the oracle picks a k per window).")
    ] = 300.0,
    max_num_seqs: Annotated[
        int | None, typer.Option(min=1, help="Sequences a worker runs at once (default: the profile's recipe).")
    ] = None,
    processes: Annotated[int, typer.Option(min=1, help="Worker processes running policies in parallel.")] = 2,
    executor: Annotated[str, typer.Option(help=EXECUTOR_HELP)] = "local",
    out: Annotated[Path, typer.Option(help="Directory for replay.md and its PNGs.")] = DEFAULT_OUT,
    stem: Annotated[str, typer.Option(help="File name stem of the report.")] = "replay",
) -> None:
    """Replay TRACE under static k, the recipe default, the controller, adaptive verification and the per-phase
    oracle on a fleet of PROFILE workers; write a Markdown + PNG report with the verdict."""
    from bench.policy.policies import LAB_POLICIES, LabPolicy, StaticSchedule
    from bench.policy.suite import static_ks
    from bench.replay.acceptance import class_map_from_store
    from bench.replay.report import verdict, write
    from bench.replay.run import replay as run_replay
    from bench.replay.run import smallest_fleet
    from bench.replay.scenario import ReplayPlan, plan_replay
    from bench.replay.trace import TraceError, read_trace
    from fleet.config import ConfigError, load_tenants
    from fleet.perf import load_profile

    console = Console(stderr=True)
    try:
        tr = read_trace(trace, speed=speed, max_duration_s=duration)
        prof = load_profile(profile)
        tenant_cfg = load_tenants(tenants) if tenants is not None else None
        classes = _parse_class_map(class_map)
        if acceptance_from_store is not None:
            classes = {**class_map_from_store(acceptance_from_store, tr, prof), **classes}
        auto = workers == "auto"
        if not auto and not workers.isdigit():
            raise typer.BadParameter(f"--workers: a whole number or 'auto', got {workers!r}")

        def plan(n: int) -> ReplayPlan:
            return plan_replay(
                tr,
                prof,
                profile_path=profile,
                workers=n,
                tenants=tenant_cfg,
                class_map=classes,
                phase_s=phase,
                max_num_seqs=max_num_seqs,
            )

        fleets: dict[str, int | None] = {}
        if auto:
            makers: dict[str, Callable[[], LabPolicy]] = {
                StaticSchedule.plain(k).name: functools.partial(StaticSchedule.plain, k) for k in static_ks(prof)
            }
            makers.update(LAB_POLICIES)
            for name, make in makers.items():
                fleets[name] = smallest_fleet(plan, make, progress=lambda m: console.print(f"[dim]{m}"))
                console.print(f"{name}: {fleets[name]} workers")
        size = max((n for n in fleets.values() if n is not None), default=2) if auto else int(workers)
        console.print(f"replaying {len(tr.requests)} requests over {tr.duration_s / 60:.1f} min on {size} workers …")
        if executor not in EXECUTORS:
            raise ConfigError(f"--executor: one of {', '.join(EXECUTORS)}, got {executor!r}")
        with make_executor(executor, processes=processes) as pool:
            result = run_replay(plan(size), progress=lambda m: console.print(f"  done {m}"), executor=pool)
        result.fleets = fleets
    except (TraceError, ConfigError) as exc:
        console.print(f"[red]{exc}")
        raise typer.Exit(2) from None
    command = "gearshift bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    path = write(result, out, command=command, stem=stem)
    console.print(f"{verdict(result)}\nwrote {path} in {result.wall_s:.1f} s")


def replay_speed(
    duration: Annotated[float, typer.Option(min=1.0, help="Trace length, seconds.")] = 3600.0,
    rate: Annotated[float, typer.Option(min=0.01, help="Arrivals per second.")] = 50.0,
    workers: Annotated[int, typer.Option(min=1, help="Workers in the fleet.")] = 4,
    policy: Annotated[list[str] | None, typer.Option(help="Lab policies or k=N (repeatable).")] = None,
    day_rate: Annotated[
        float, typer.Option(help="Project a day at this rate (req/s) from the measured speed.")
    ] = 100.0,
    diurnal: Annotated[bool, typer.Option(help="The trace's rate follows a day's shape (mean --rate).")] = False,
    in_memory: Annotated[
        bool, typer.Option(help="Keep every record (the definitions' path) instead of streaming the metrics.")
    ] = False,
    out: Annotated[Path, typer.Option(help="Directory for replay-speed.md.")] = DEFAULT_OUT,
) -> None:
    """How fast the lab replays a synthetic trace: simulated seconds per wall second (reading included), per
    policy, and the projected wall time of one policy and of the full report on a day at ``--day-rate``."""
    import os

    from bench.markdown import table
    from bench.replay.run import replay_policies
    from bench.replay.speed import measure
    from fleet.perf import load_profile

    console = Console(stderr=True)
    names = policy or ["gearshift", "k=7"]
    load = os.getloadavg()
    rows: list[list[object]] = []
    per_policy_day: dict[str, float] = {}
    for name in names:
        console.print(f"replaying {duration:g} s at {rate:g} req/s on {workers} workers under {name} …")
        r = measure(
            duration_s=duration, rate_per_s=rate, workers=workers, policy=name, diurnal=diurnal, streamed=not in_memory
        )
        day = 86400.0 * (day_rate / rate) / r.ratio
        per_policy_day[name] = day
        rows.append(
            [
                name,
                r.requests,
                r.simulated_s,
                r.read_s,
                r.run_s,
                r.cpu_s,
                r.ratio,
                round(r.worker_s_per_wall_s),
                round(r.worker_s_per_cpu_s),
                round(r.peak_rss_bytes / 2**20),
                day / 60,
            ]
        )
        console.print(
            f"  {r.ratio:.1f} simulated s per wall s ({r.worker_s_per_wall_s:.0f} worker-s per wall s, "
            f"{r.worker_s_per_cpu_s:.0f} per CPU s), peak RSS {r.peak_rss_bytes / 2**20:.0f} MiB"
        )
    end_load = os.getloadavg()
    policies = len(replay_policies(load_profile("kimi-k3-dspark-tp16"))) + 1
    slowest = max(per_policy_day.values())
    command = "gearshift bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    text = "\n".join(
        [
            "# Replay speed",
            "",
            f"Command: `{command}` (load average at the start: {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f}, at the "
            f"end: {end_load[0]:.1f}, {end_load[1]:.1f}, {end_load[2]:.1f} on {os.cpu_count()} cores; each policy "
            f"replays in a fresh process; metrics {'from every kept record' if in_memory else 'streamed'}).",
            "",
            f"A synthetic Poisson trace of {duration:g} s at {rate:g} req/s (half interactive chat, half batch "
            f"maths; prompts 256–768, outputs 32–96 tokens) written to a file, read back and replayed on {workers} "
            "workers of the default profile. Wall time includes reading the trace and computing the metrics.",
            "",
            table(
                [
                    "policy",
                    "requests",
                    "simulated s",
                    "read s",
                    "replay s",
                    "CPU s",
                    "sim s / wall s",
                    "worker-s / wall s",
                    "worker-s / CPU s",
                    "peak RSS MiB",
                    f"day at {day_rate:g} req/s, min",
                ],
                rows,
            ),
            "",
            f"**A day at {day_rate:g} req/s** is projected, not measured: the same request shape at "
            f"{day_rate / rate:g}× the rate on {day_rate / rate:g}× the workers costs that much more wall time per "
            f"simulated second (the lab's work is linear in requests and engine steps). One policy: up to "
            f"{slowest / 60:.0f} min; the full report of {policies} policies on 2 processes: about "
            f"{policies * slowest / 120:.0f} min. Target (issue 17): one policy in under 15 min.",
            "",
        ]
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "replay-speed.md").write_text(text)
    console.print(f"wrote {out / 'replay-speed.md'}")


def replay_check(
    duration: Annotated[float, typer.Option(min=5.0, help="Seconds of real traffic per run.")] = 60.0,
    rate: Annotated[float, typer.Option(min=0.1, help="Open-loop arrivals per second, each tier.")] = 2.0,
    sessions: Annotated[int, typer.Option(min=0, help="Closed-loop interactive sessions.")] = 4,
    out: Annotated[Path, typer.Option(help="Directory for replay-check.md and the fitted profile.")] = DEFAULT_OUT,
) -> None:
    """Record real traffic on the embedded stack (controller on, then static k), replay each run's ledger with a
    profile fitted to its workers, and compare the prediction with the gateway's own measurements."""
    import asyncio

    from bench.replay.check import CheckConfig, check
    from bench.replay.report import render_check

    console = Console(stderr=True)
    config = CheckConfig(duration_s=duration, rate_per_s=rate, sessions=sessions)
    result = asyncio.run(check(config, out / "replay-check", progress=lambda m: console.print(f"[dim]{m}")))
    command = "gearshift bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    out.mkdir(parents=True, exist_ok=True)
    path = out / "replay-check.md"
    path.write_text(render_check(result, command=command) + "\n")
    for comp in result.comparisons:
        n = comp.verdicts()
        counts = f"{n['within']} within 15 %, {n['within its CI']} within their CI, {n['miss']} missed"
        console.print(f"{comp.policy}: {counts}")
    console.print(f"wrote {path} in {result.wall_s:.0f} s")


def drive(
    gateway: Annotated[
        str | None, typer.Option(help="Gateway base URL (default: GEARSHIFT_HOST and GEARSHIFT_PORT).")
    ] = None,
    duration: Annotated[float, typer.Option(min=1.0, help="Seconds of traffic.")] = 60.0,
    rate: Annotated[float, typer.Option(min=0.1, help="Open-loop arrivals per second, each tier.")] = 2.0,
    sessions: Annotated[int, typer.Option(min=0, help="Closed-loop interactive sessions (x-gearshift-session).")] = 4,
    model: Annotated[str, typer.Option(help="Model name.")] = "kimi-k3",
) -> None:
    """Drive the embedded stack's demo tenants (interactive and batch) with streamed chat requests: open-loop
    arrivals per tier plus closed-loop sessions, so the ledger has traffic to export and replay."""
    import asyncio

    from bench.replay.check import CheckConfig
    from bench.replay.check import drive as run_drive
    from gearshift.cli.usage import local_gateway_url

    console = Console(stderr=True)
    config = CheckConfig(duration_s=duration, rate_per_s=rate, sessions=sessions)
    gateway = gateway or local_gateway_url()
    sent = asyncio.run(run_drive(gateway, model, config, progress=lambda m: console.print(f"[dim]{m}")))
    console.print(f"sent {sent} requests through {gateway}")
