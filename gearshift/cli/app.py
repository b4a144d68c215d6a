"""The ``gearshift`` command line: the composition root that wires the packages together.

Every module of ``gearshift.cli`` that adds commands has one ``register(root)``; this module calls each once.
"""

from __future__ import annotations

import typer

from gearshift.cli import bench, controller, gateway, profile, sim, top, up, usage, worker

app = typer.Typer(
    name="gearshift",
    help="A serving gateway that shifts each vLLM worker's speculation length as load changes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
for command_module in (worker, sim, up, bench, gateway, controller, top, profile, usage):
    command_module.register(app)


def main() -> None:
    app()
