"""``gearshift profile``: fit a performance profile to a live worker (simulated or real vLLM)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import httpx
import typer

from bench.profiler.sweep import Point, SweepConfig
from bench.profiler.worker_client import ProfilerError
from fleet.config import CommonSettings, ConfigError
from fleet.perf import load_profile
from fleet.speculation_client import SpeculationCallError, SpeculationClient


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise typer.BadParameter(f"{option}: comma-separated integers expected, got {text!r}") from exc
    if not values or min(values) < 0:
        raise typer.BadParameter(f"{option}: at least one value, none negative, got {text!r}")
    return values


def _echo_point(point: Point) -> None:
    typer.echo(
        f"B={point.batch_size:<4} k={point.k:<2} step {point.step_s * 1e3:8.3f} ms over {point.steps:.0f} steps,"
        f" context {point.context_tokens:.0f} tokens",
        err=True,
    )


async def _default_ks(worker: str, token: str) -> tuple[int, ...]:
    """0, 1, 2, 4 and the worker's k_max (those at most k_max)."""
    async with httpx.AsyncClient(timeout=10.0) as client:
        k_max = (await SpeculationClient(client, control_token=token).state(worker)).k_max
    return tuple(sorted({k for k in (0, 1, 2, 4) if k <= k_max} | {k_max}))


def profile(
    worker: Annotated[str, typer.Option("--worker", help="Worker base URL, e.g. http://127.0.0.1:8000.")],
    out: Annotated[Path | None, typer.Option("--out", help="Profile YAML to write (default: stdout).")] = None,
    batch_sizes: Annotated[str, typer.Option("--batch-sizes", help="Concurrent streams per point.")] = "1,2,4,8,16,32",
    ks: Annotated[
        str | None,
        typer.Option("--ks", help="Speculation lengths to sweep (≤ the worker's k_max; default 0,1,2,4,k_max)."),
    ] = None,
    base: Annotated[
        str, typer.Option("--base-profile", help="Profile whose structure (experts, bandwidth…) is kept.")
    ] = "kimi-k3-dspark-tp16",
    name: Annotated[str | None, typer.Option("--name", help="Name of the fitted profile.")] = None,
    window_steps: Annotated[int, typer.Option("--window-steps", min=2, help="Engine steps per point.")] = 40,
    prompt_words: Annotated[int, typer.Option("--prompt-words", min=2, help="Prompt length, words.")] = 16,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", min=1, help="Tokens per stream.")] = None,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="Sampling temperature.")] = 0.0,
    workload: Annotated[str, typer.Option("--workload", help="Acceptance class name to write.")] = "measured",
    point_timeout_s: Annotated[float, typer.Option("--point-timeout", help="Seconds per point.")] = 120.0,
    poll_s: Annotated[float, typer.Option("--poll", min=0.001, help="Seconds between /metrics scrapes.")] = 0.1,
) -> None:
    """Sweep a live worker over batch sizes and k through its control API, measure step time and per-position
    acceptance from its /metrics, and fit the profile's step-time parameters (least squares). The control
    token comes from GEARSHIFT_CONTROL_TOKEN."""
    from bench.profiler.output import render  # the fit needs numpy, from the bench extra
    from bench.profiler.run import profile_worker

    token = CommonSettings().control_token.get_secret_value()
    sizes = _ints(batch_sizes, "--batch-sizes")
    swept = _ints(ks, "--ks") if ks is not None else None
    if swept is None:
        try:
            swept = asyncio.run(_default_ks(worker, token))
        except (httpx.HTTPError, SpeculationCallError) as exc:
            typer.echo(f"error: {worker}: cannot read its speculation state: {exc}", err=True)
            raise typer.Exit(1) from exc
    config = SweepConfig(
        batch_sizes=sizes,
        ks=swept,
        window_steps=window_steps,
        prompt_words=prompt_words,
        temperature=temperature,
        max_tokens=max_tokens,
        point_timeout_s=point_timeout_s,
        poll_s=poll_s,
    )
    try:
        base_profile = load_profile(base)
        fit = asyncio.run(
            profile_worker(
                worker,
                config,
                base=base_profile,
                control_token=token,
                name=name,
                workload=workload,
                progress=_echo_point,
            )
        )
    except (ConfigError, ProfilerError, ValueError, TimeoutError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    text = render(fit, worker_url=worker, base_name=base, config=config)
    if out is None:
        typer.echo(text)
    else:
        out.write_text(text)
        typer.echo(f"wrote {out}: largest fit error {100 * fit.max_relative_error():.2f} %", err=True)


def register(root: typer.Typer) -> None:
    """Add ``gearshift profile`` to the root command."""
    root.command("profile")(profile)
