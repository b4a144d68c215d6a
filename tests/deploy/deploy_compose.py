"""Reading deploy/compose/compose.yaml as Docker Compose would: interpolation, services, ports, mounts.

This machine has no Docker engine, so the compose file is checked by reading it: ``${VAR:-default}`` is
interpolated from a given environment (defaults otherwise), YAML merge keys are resolved by the loader, and
each service's command, environment, ports and bind mounts are exposed for the tests.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .deploy_contracts import ROOT

COMPOSE_DIR = ROOT / "deploy" / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
GEARSHIFT_IMAGES = ("gearshift:dev", "gearshift-vllm:dev")

TOP_LEVEL = {"name", "services", "volumes", "networks", "configs", "secrets"}
SERVICE_KEYS = {
    "image", "build", "command", "entrypoint", "environment", "env_file", "ports", "expose", "volumes",
    "depends_on", "healthcheck", "restart", "profiles", "deploy", "ipc", "shm_size", "networks", "labels",
    "user", "working_dir", "ulimits", "stop_grace_period", "logging",
}  # fmt: skip
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?([-?])([^}]*))?\}")


class MissingVariable(KeyError):
    """A ``${VAR:?message}`` variable is unset or empty: Compose refuses to start with ``message``."""


def _substitute(match: re.Match[str], env: Mapping[str, str]) -> str:
    name, kind, text = match.group(1), match.group(2), match.group(3) or ""
    if env.get(name):
        return env[name]
    if kind == "?":
        raise MissingVariable(f"{name}: {text}")
    return text


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's ``${VAR}`` / ``${VAR:-default}`` / ``${VAR:?message}`` interpolation, applied to every string in
    ``value``."""
    if isinstance(value, str):
        out = _VAR.sub(lambda m: _substitute(m, env), value)
        assert "$" not in out.replace("$$", ""), f"uninterpolated variable in {value!r}"
        return out
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def load(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    return {k: interpolate(v, env or {}) for k, v in raw.items() if not k.startswith("x-")}


@dataclass(frozen=True)
class Service:
    name: str
    spec: dict[str, Any]

    @property
    def env(self) -> dict[str, str]:
        env = self.spec.get("environment", {})
        assert isinstance(env, dict), f"{self.name}: environment must be a mapping"
        return {k: str(v) for k, v in env.items()}

    @property
    def argv(self) -> list[str]:
        command = self.spec.get("command", [])
        assert isinstance(command, list), f"{self.name}: command must be a list (exec form)"
        return [str(c) for c in command]

    @property
    def profiles(self) -> list[str]:
        return list(self.spec.get("profiles", []))

    @property
    def is_gearshift(self) -> bool:
        return self.spec.get("image") in GEARSHIFT_IMAGES

    def published(self) -> dict[int, int]:
        """Container port → host port for every ``HOST:CONTAINER`` mapping."""
        pairs = [str(p).split(":") for p in self.spec.get("ports", [])]
        return {int(container): int(host) for host, container in pairs}

    def bind_mounts(self) -> dict[str, Path]:
        """Container path → host path of every bind mount (relative host paths are from the compose dir)."""
        mounts: dict[str, Path] = {}
        for volume in self.spec.get("volumes", []):
            source, target = str(volume).split(":")[:2]
            if source.startswith((".", "/")):
                mounts[target] = (COMPOSE_DIR / source).resolve()
        return mounts

    def host_file(self, container_path: str) -> Path:
        """The host file behind ``container_path``, through the longest bind mount above it."""
        for target, source in sorted(self.bind_mounts().items(), key=lambda kv: -len(kv[0])):
            if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
                return source / container_path[len(target) :].lstrip("/")
        raise AssertionError(f"{self.name}: {container_path} is on no bind mount")

    def healthcheck_url(self) -> str | None:
        test = self.spec.get("healthcheck", {}).get("test", [])
        found = re.search(r"https?://[^'\" ]+", " ".join(map(str, test)))
        return found.group(0) if found else None


def services(compose: dict[str, Any]) -> dict[str, Service]:
    return {name: Service(name, spec) for name, spec in compose["services"].items()}
