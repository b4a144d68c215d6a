"""The ``gearshift`` command line: the composition root that wires the packages together."""

from __future__ import annotations

import typer

from gearshift import cli_worker
from gearshift.cli_bench import bench_app
from gearshift.cli_sim import sim_app
from gearshift.up import up

app = typer.Typer(
    name="gearshift",
    help="A serving gateway that shifts each vLLM worker's speculation length as load changes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(cli_worker.app, name="worker")
app.add_typer(sim_app, name="sim")
app.command("up")(up)
app.add_typer(bench_app, name="bench")


def main() -> None:
    app()
