"""What the code actually reads and serves, for checking deployment files against it.

- the ``gearshift`` sub-commands (from the Typer app) and their options;
- the environment variables each process's pydantic-settings class reads (``GEARSHIFT_<field>``, aliases,
  nested ``__`` fields), and whether given values validate;
- the HTTP paths each app serves (from the app factories' route tables) and the port it listens on;
- every metric series name the code can expose (from the metric registries, with Prometheus's suffixes).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer.main
from pydantic import AliasChoices, BaseModel
from pydantic_settings import BaseSettings

from fleet.clock import ManualClock
from fleet.config import FleetConfig, load_fleet, load_tenants

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------------------------- commands
@dataclass(frozen=True)
class Process:
    """A gearshift process a container runs: its CLI path, settings class and what it serves."""

    command: tuple[str, ...]
    settings: str
    """``module:Class`` of the settings the process reads from its environment."""
    port_field: str | None
    """Settings field holding the HTTP port; None when the port comes from the fleet file (vLLM)."""
    serves: bool = True
    """False for a process that listens on nothing (a batch job)."""


PROCESSES = (
    Process(("gateway",), "gateway.settings:GatewaySettings", "port"),
    Process(("controller",), "controller.settings:ControllerSettings", "metrics_port"),
    Process(("sim", "serve"), "workers.sim.settings:SimWorkerSettings", "port"),
    # The launcher reads CommonSettings; the plugin inside vLLM reads VllmPluginSettings (a superset).
    Process(("worker", "vllm"), "workers.vllm.settings:VllmPluginSettings", None),
    Process(("usage", "retain"), "fleet.config:CommonSettings", None, serves=False),
)

VLLM_PATHS = frozenset({"/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions"})
"""Paths vLLM's own OpenAI API server serves (vLLM is not importable in the main virtualenv)."""


def settings_class(process: Process) -> type[BaseSettings]:
    module, name = process.settings.split(":")
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, BaseSettings)
    return cls


def cli_root() -> Any:
    """The ``gearshift`` command group (Typer's own click copy: duck-typed here)."""
    from gearshift.cli.app import app

    return typer.main.get_command(app)


def resolve_command(argv: list[str]) -> tuple[Process, Any, list[str]]:
    """The process an argv (after the ``gearshift`` entrypoint) runs, its click command, and its own args."""
    for process in PROCESSES:
        if tuple(argv[: len(process.command)]) == process.command:
            command = cli_root()
            for word in process.command:
                assert hasattr(command, "get_command"), f"{word!r}: not a command group"
                sub = command.get_command(None, word)
                assert sub is not None, f"`gearshift {' '.join(process.command)}`: no such sub-command"
                command = sub
            return process, command, argv[len(process.command) :]
    raise AssertionError(f"`gearshift {' '.join(argv)}` runs none of {[' '.join(p.command) for p in PROCESSES]}")


def option_values(command: Any, args: list[str]) -> dict[str, str]:
    """``--option value`` pairs of ``args``; fails on an option the command does not declare."""
    declared = {opt: param for param in command.params for opt in getattr(param, "opts", [])}
    values: dict[str, str] = {}
    it = iter(args)
    for word in it:
        assert word in declared, f"{command.name}: unknown option {word!r}; declared: {sorted(declared)}"
        param = declared[word]
        values[word] = "true" if getattr(param, "is_flag", False) else next(it)
    return values


# ----------------------------------------------------------------------------------------------- settings
def env_names(cls: type[BaseSettings]) -> set[str]:
    """Upper-cased environment variable names ``cls`` reads (prefix + field, aliases, nested ``__`` fields)."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    nested = cls.model_config.get("env_nested_delimiter")
    names: set[str] = set()
    for field_name, info in cls.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            names |= {str(choice).upper() for choice in alias.choices if isinstance(choice, str)}
        elif isinstance(alias, str):
            names.add(alias.upper())
        else:
            names.add(f"{prefix}{field_name}".upper())
        annotation = info.annotation
        if nested and isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names |= {f"{prefix}{field_name}{nested}{sub}".upper() for sub in annotation.model_fields}
    return names


@contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """Run with exactly the ``GEARSHIFT_*`` variables of ``env`` set (others of the test process hidden)."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("GEARSHIFT_")}
    for key in saved:
        del os.environ[key]
    os.environ.update({k: v for k, v in env.items() if k.startswith("GEARSHIFT_")})
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith("GEARSHIFT_")]:
            del os.environ[key]
        os.environ.update(saved)


def load_settings(process: Process, env: Mapping[str, str]) -> BaseSettings:
    """Build the process's settings from ``env`` exactly as the process would (validation errors raise)."""
    with environment(env):
        return settings_class(process)()


# ------------------------------------------------------------------------------------------- HTTP surface
def served_paths(process: Process) -> frozenset[str]:
    """Every HTTP path the process's app serves, from its factory's route table."""
    if process.command == ("gateway",):
        from fleet.store.memory import MemoryStore
        from gateway.http.app import create_app
        from gateway.settings import GatewaySettings
        from gateway.wiring import GatewayDeps

        app = create_app(
            GatewayDeps(
                GatewaySettings(),
                store=MemoryStore(clock=ManualClock()),
                clock=ManualClock(),
                fleet=load_fleet(),
                tenants=load_tenants(),
            )
        )
        # FastAPI includes routers lazily; its OpenAPI document lists every schema route's path.
        return frozenset(app.openapi()["paths"])
    if process.command == ("sim", "serve"):
        from workers.sim.server import create_app as create_sim_app
        from workers.sim.settings import SimWorkerSettings

        sim = create_sim_app(SimWorkerSettings(), clock=ManualClock())
        return frozenset(resource.canonical for resource in sim.router.resources())
    if process.command == ("controller",):
        return controller_paths()
    return VLLM_PATHS


def controller_paths() -> frozenset[str]:
    """The controller serves only its metrics (``controller.app.metrics_app``): its route table."""
    from prometheus_client import CollectorRegistry

    from controller.app import metrics_app

    app = metrics_app(CollectorRegistry(), token=None)
    return frozenset(resource.canonical for resource in app.router.resources())


def listen_port(process: Process, settings: BaseSettings, fleet: FleetConfig | None, worker_id: str | None) -> int:
    """The TCP port the process listens on with these settings (vLLM: from its fleet entry's URL)."""
    if process.port_field is not None:
        return int(getattr(settings, process.port_field))
    from workers.vllm.launcher import build_launch

    assert fleet is not None
    assert worker_id is not None
    worker = fleet.worker(worker_id)
    assert worker is not None, f"--worker-id {worker_id}: not in the fleet file"
    argv = list(build_launch(worker).argv)
    return int(argv[argv.index("--port") + 1])


def bind_host(process: Process, settings: BaseSettings) -> str | None:
    """The address the process binds (the host field beside its port field); None when the launcher derives it."""
    if process.port_field is None:
        return None
    return str(getattr(settings, process.port_field.removesuffix("port") + "host"))


# ------------------------------------------------------------------------------------------------ metrics
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "unknown": ("",),
}


def _families() -> Iterator[tuple[str, str]]:
    """(family name, type) of every metric the gateway, the controller and the workers export."""
    from prometheus_client.parser import text_string_to_metric_families

    from controller.metrics import ControllerMetrics
    from fleet.speculation import SpeculationControl, uniform_schedule
    from gateway.usage.metrics import GatewayMetrics
    from workers.sim.exposition import render
    from workers.sim.stats import EngineStats

    for registry in (GatewayMetrics().registry, ControllerMetrics().registry):
        for family in registry.collect():
            yield family.name, family.type
    control = SpeculationControl(
        worker_id="w",
        method="dspark",
        k_max=8,
        max_num_seqs=256,
        fallback=uniform_schedule(8, max_num_seqs=256),
        clock=ManualClock(),
    )
    text = render(EngineStats(k_max=8), control, model_name="m").decode()
    for family in text_string_to_metric_families(text):
        yield family.name, family.type


def exported_series() -> frozenset[str]:
    """Every series name the code can expose, as Prometheus stores it (counters end in ``_total`` etc.)."""
    names = set()
    for family, kind in _families():
        names |= {family + suffix for suffix in _SUFFIXES[kind]}
    return frozenset(names)
