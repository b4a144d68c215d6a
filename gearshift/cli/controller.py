"""``gearshift controller …``: run the adaptive speculation controller, explain its decisions, or run the
virtual-time load-ramp comparison."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Annotated

import httpx
import typer
from pydantic import ValidationError
from rich.console import Console

from bench.policy.ramp import DEFAULT_LEVELS, markdown, ramp_comparison
from controller.app import ControllerComponent, build_controller
from controller.loop import Controller
from controller.settings import ControllerSettings
from fleet.clock import SystemClock
from fleet.config import ConfigError
from fleet.perf import load_profile
from fleet.store.memory import MemoryStore
from gearshift.cli.explain import explain
from gearshift.cli.explain_plan import plans_view, stored_plans
from gearshift.cli.up import run_until_signalled

controller_app = typer.Typer(
    help="The adaptive speculation controller (settings from GEARSHIFT_* and the fleet file).",
    invoke_without_command=True,
)


def _settings(**overrides: object) -> ControllerSettings:
    try:
        settings = ControllerSettings(**overrides)  # type: ignore[arg-type]
        settings.fleet()
        settings.tenants()
    except (ValidationError, ConfigError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    return settings


@controller_app.callback()
def run(
    ctx: typer.Context,
    dry_run: bool = typer.Option(False, "--dry-run", help="Shadow mode: decide and export, never apply."),
) -> None:
    """Run the controller until Ctrl-C (leader election through the store; standby otherwise)."""
    if ctx.invoked_subcommand is not None:
        return
    overrides: dict[str, object] = {"dry_run": True} if dry_run else {}
    settings = _settings(**overrides)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    component = ControllerComponent(settings)
    run_until_signalled([component], lambda started: typer.echo("controller: " + "\n  ".join(component.describe())))


async def sample(settings: ControllerSettings, ticks: int) -> Controller:
    """A dry-run controller that has ticked ``ticks`` times against the fleet's workers."""
    clock = SystemClock()
    async with httpx.AsyncClient() as client:
        controller = build_controller(settings, store=MemoryStore(clock=clock), client=client, clock=clock)
        for i in range(ticks):
            if i:
                await clock.sleep(settings.tick_s)
            await controller.tick()
    return controller


@controller_app.command("explain")
def explain_cmd(
    ticks: int = typer.Option(3, min=2, help="Ticks to sample (the first only sets the baseline)."),
) -> None:
    """Print the fleet plan in the store (pools, gears, per-class acceptance, why), then sample every worker for a
    few ticks (dry-run) and print, per worker, the estimate, the predicted goodput and TPOT of every candidate k,
    and the decision with its reason."""
    settings = _settings(dry_run=True, metrics_port=0)
    controller = asyncio.run(sample(settings, ticks))
    Console().print(plans_view(asyncio.run(stored_plans(settings)), now=time.time()))
    Console().print(explain(controller.workers.values()))


@controller_app.command("ramp")
def ramp_cmd(
    profile: str = typer.Option("kimi-k3-dspark-tp16", help="Performance profile name or YAML path."),
    levels: str = typer.Option(",".join(map(str, DEFAULT_LEVELS)), help="Concurrent streams per phase."),
    phase_s: float = typer.Option(60.0, min=1, help="Virtual seconds per phase."),
    workload: str = typer.Option("maths", help="Acceptance class of the requests."),
    prompt_tokens: int = typer.Option(1000, min=1),
    output_tokens: int = typer.Option(400, min=1),
    seed: int = typer.Option(1),
    markdown_out: Annotated[Path | None, typer.Option("--markdown", help="Also write the tables here.")] = None,
) -> None:
    """Virtual-time load ramp: the controller against static k=0 and k=8 on the same seeded trace."""
    try:
        steps = tuple(int(x) for x in levels.split(","))
    except ValueError as exc:
        raise typer.BadParameter(f"levels: comma-separated integers, got {levels!r}") from exc
    report = asyncio.run(
        ramp_comparison(
            load_profile(profile), levels=steps, phase_s=phase_s, workload=workload, prompt_tokens=prompt_tokens,
            output_tokens=output_tokens, seed=seed,
        )
    )  # fmt: skip
    text = markdown(report)
    typer.echo(text)
    if markdown_out is not None:
        markdown_out.write_text(text + "\n")


def register(root: typer.Typer) -> None:
    """Add ``gearshift controller …`` to the root command."""
    root.add_typer(controller_app, name="controller")
