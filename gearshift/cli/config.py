"""``gearshift config check``: validate a process's configuration before a rollout (issue 27) — the environment
(no unknown ``GEARSHIFT_*`` variable, every value valid, no development or placeholder secret outside the embedded
default), the fleet and tenants files it names — and print the effective configuration with secrets masked."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

import typer
from pydantic import SecretStr, ValidationError
from pydantic_settings import BaseSettings

from fleet.config import CommonSettings, ConfigError
from gearshift.cli.settings_catalog import PROCESSES, check_environment, settings_of

MASK = "********"
config_app = typer.Typer(help="The configuration: check it before a rollout.")


def masked(value: Any) -> str:
    """A setting's value for display: secrets masked, and a URL's password."""
    if isinstance(value, SecretStr):
        return MASK
    text = "" if value is None else str(value.value if hasattr(value, "value") else value)
    if "://" in text:
        parts = urlsplit(text)
        if parts.password:
            netloc = f"{parts.username or ''}:{MASK}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
            return urlunsplit(parts._replace(netloc=netloc))
    return text


def effective(settings: BaseSettings) -> Iterator[tuple[str, str]]:
    """(variable, masked value) of every setting the process reads, set or defaulted."""
    for s in settings_of(type(settings)):
        value = getattr(settings, s.field.split(".")[0])
        if "." in s.field:
            value = getattr(value, s.field.split(".")[1])
        yield s.env, masked(value)


@config_app.command("check")
def check_command(
    process: Annotated[
        str, typer.Argument(help=f"The process whose settings to check: {', '.join(PROCESSES)}.")
    ] = "common",
    quiet: Annotated[bool, typer.Option("--quiet", help="Only the verdict, not the effective configuration.")] = False,
) -> None:
    """Validate the environment and the files as PROCESS would read them at start; print the effective
    configuration (secrets masked). Exits 0 when it would start, 2 with the reasons when it would not."""
    if process not in PROCESSES:
        typer.echo(f"error: no process {process!r}; one of {', '.join(PROCESSES)}", err=True)
        raise typer.Exit(2)
    problems: list[str] = []
    try:
        check_environment(os.environ)
    except ConfigError as exc:
        problems.append(str(exc))
    settings: BaseSettings | None = None
    try:
        settings = PROCESSES[process]()
    except ValidationError as exc:
        problems += [f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors()]
    except ConfigError as exc:
        problems.append(str(exc))
    summary: list[str] = []
    if isinstance(settings, CommonSettings):
        try:
            fleet, tenants = settings.fleet(), settings.tenants()
            summary.append(f"fleet: {len(fleet.models)} models, {len(fleet.workers)} workers")
            summary.append(f"tenants: {len(tenants.tiers)} tiers, {len(tenants.tenants)} tenants")
        except ConfigError as exc:
            problems.append(str(exc))
    if settings is not None and not quiet:
        for env, value in effective(settings):
            typer.echo(f"{env}={value}")
    for line in summary:
        typer.echo(line)
    if problems:
        for problem in problems:
            typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)
    typer.echo(f"ok: {process} would start with this configuration")


def register(root: typer.Typer) -> None:
    """Add ``gearshift config …`` to the root command."""
    root.add_typer(config_app, name="config")
