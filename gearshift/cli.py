"""The ``gearshift`` command line: the composition root that wires the packages together."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="gearshift",
    help="A serving gateway that shifts each vLLM worker's speculation length as load changes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def main() -> None:
    app()
