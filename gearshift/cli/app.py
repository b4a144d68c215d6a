"""The ``gearshift`` command line: the composition root that wires the packages together.

Every module of ``gearshift.cli`` that adds commands has one ``register(root)``; this module calls each once.
"""

from __future__ import annotations

import os
from importlib.metadata import version as package_version
from typing import Annotated

import typer

from fleet.config import ConfigError
from gearshift.cli import bench, config, controller, gateway, profile, sim, top, up, usage, worker
from gearshift.cli.settings_catalog import check_environment

app = typer.Typer(
    name="gearshift",
    help="A serving gateway that shifts each vLLM worker's speculation length as load changes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
for command_module in (worker, sim, up, bench, gateway, controller, top, profile, usage, config):
    command_module.register(app)


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    show_version: Annotated[
        bool, typer.Option("--version", is_eager=True, help="Print gearshift's version and exit.")
    ] = False,
) -> None:
    """Before any command: an unknown GEARSHIFT_* variable (a typo) is refused, with the closest known name."""
    if show_version:
        typer.echo(f"gearshift {package_version('gearshift')}")
        raise typer.Exit()
    try:
        check_environment(os.environ)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())


def main() -> None:
    app()
