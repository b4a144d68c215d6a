"""Every ``GEARSHIFT_*`` setting of every gearshift process, from the settings classes themselves (issue 27): the
environment check that refuses an unknown variable at start ("did you mean"), ``gearshift config check`` and the
generated configuration reference (``gearshift.cli.config_reference``) all read this one catalogue.

pydantic-settings ignores environment variables it has no field for, so ``GEARSHIFT_REDIS_ULR`` would silently
leave the store in memory; this module is what catches it. A variable is known when any process reads it (one
environment often serves several processes, as compose's shared block does) or when the deployment tooling
reads it (compose's image and fleet selectors, the scripts).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from pydantic import AliasChoices, BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from controller.settings import ControllerSettings
from fleet.config import CommonSettings, ConfigError
from gateway.settings import GatewaySettings
from workers.sim.settings import SimWorkerSettings
from workers.vllm.settings import VllmPluginSettings

PROCESSES: Final[Mapping[str, type[BaseSettings]]] = {
    "common": CommonSettings,
    "gateway": GatewaySettings,
    "controller": ControllerSettings,
    "sim": SimWorkerSettings,
    "vllm-plugin": VllmPluginSettings,
}
"""Settings class of each process (``common``: what every process reads, the ``gearshift worker``/``usage`` CLI)."""

TOOLING: Final = frozenset(
    {
        "GEARSHIFT_FLEET",  # deploy/compose: which fleet file the stack mounts
        "GEARSHIFT_BASE_IMAGE",  # deploy/docker, deploy/compose: image overrides
        "GEARSHIFT_REDIS_IMAGE",
        "GEARSHIFT_PROMETHEUS_IMAGE",
        "GEARSHIFT_COMPOSE_WORK",  # scripts/compose-check.sh
        "GEARSHIFT_TENANT_KEY",  # scripts/schemathesis-up.sh
        "GEARSHIFT_BENCH_BODY",  # bench/gateway/wrk.py: read by wrk's Lua, not by Python
        "GEARSHIFT_BENCH_KEY",
        "GEARSHIFT_ALLOW_UNKNOWN_ENV",  # this module: let unknown variables through
        "GEARSHIFT_LAB_NATIVE",  # workers/sim/__init__.py: 0 loads the lab's sources over a compiled build
    }
)
"""``GEARSHIFT_*`` variables the deployment tooling reads, not a settings class."""


@dataclass(frozen=True)
class Setting:
    """One environment variable of one settings class."""

    env: str
    field: str
    info: FieldInfo
    owner: type[BaseSettings]
    model: type[BaseModel]
    """The class that declares the field (the settings class, or the nested model of a ``__`` field)."""


def settings_of(cls: type[BaseSettings]) -> Iterator[Setting]:
    """The variables ``cls`` reads: prefix + field (or its aliases), and ``__``-nested fields of a model field."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    nested = cls.model_config.get("env_nested_delimiter")
    for name, info in cls.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            names = [str(c).upper() for c in alias.choices if isinstance(c, str)]
        elif isinstance(alias, str):
            names = [alias.upper()]
        else:
            names = [f"{prefix}{name}".upper()]
        for env in names:
            yield Setting(env=env, field=name, info=info, owner=cls, model=cls)
        annotation = info.annotation
        if nested and isinstance(annotation, type) and issubclass(annotation, BaseModel):
            for sub, sub_info in annotation.model_fields.items():
                env = f"{prefix}{name}{nested}{sub}".upper()
                yield Setting(env=env, field=f"{name}.{sub}", info=sub_info, owner=cls, model=annotation)


def known_variables() -> frozenset[str]:
    return frozenset(s.env for cls in PROCESSES.values() for s in settings_of(cls)) | TOOLING


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """Each ``GEARSHIFT_*`` name in ``environ`` no process reads, with the closest known name (or None)."""
    known = known_variables()
    out = []
    for name in sorted(n for n in environ if n.startswith("GEARSHIFT_") and n not in known):
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        out.append((name, close[0] if close else None))
    return out


def check_environment(environ: Mapping[str, str]) -> None:
    """Raise ``ConfigError`` naming every unknown ``GEARSHIFT_*`` variable of ``environ`` (``GEARSHIFT_ALLOW_UNKNOWN_ENV
    =1`` lets them pass, for a variable of a newer gearshift during an upgrade)."""
    if environ.get("GEARSHIFT_ALLOW_UNKNOWN_ENV") == "1":
        return
    unknown = unknown_variables(environ)
    if unknown:
        parts = [f"{name} (did you mean {close}?)" if close else name for name, close in unknown]
        raise ConfigError(
            f"unknown environment variable{'s' if len(parts) > 1 else ''}: {', '.join(parts)}; no gearshift process "
            "reads it (docs/operations/config-reference.md lists every setting)"
        )
