"""The ``gearshift`` command line: the composition root that wires the packages together."""

from __future__ import annotations

import typer

from gearshift import cli_gateway, cli_profile, cli_sim_lab, cli_soak, cli_worker
from gearshift.cli_bench import bench_app
from gearshift.cli_controller import controller_app
from gearshift.cli_sim import sim_app
from gearshift.top import top
from gearshift.up import up

app = typer.Typer(
    name="gearshift",
    help="A serving gateway that shifts each vLLM worker's speculation length as load changes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(cli_worker.app, name="worker")
cli_sim_lab.register(sim_app)
app.add_typer(sim_app, name="sim")
app.command("up")(up)
cli_soak.register(bench_app)
app.add_typer(bench_app, name="bench")
app.command("gateway")(cli_gateway.run)
app.add_typer(controller_app, name="controller")
app.command("top")(top)
app.command("profile")(cli_profile.profile)


def main() -> None:
    app()
