"""What the gateway benchmark sends load to: the upstream directly, the minimal pass-through proxy, the
gearshift gateway, and any other proxy given as a command.

A ``Target`` is a URL plus the process behind it (None for the upstream itself, which the bench also starts).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bench.procs import Proc, free_port, python_module, spawn, wait_http_ready

CHAT_PATH = "/v1/chat/completions"


@dataclass
class Target:
    name: str
    base_url: str
    """Scheme, host and port, no path."""
    api_key: str | None = None
    child: Proc | None = None
    """The proxy process (None for the direct upstream)."""
    note: str = ""
    """What runs behind the name (shown in the report)."""

    @property
    def chat_url(self) -> str:
        return self.base_url + CHAT_PATH

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()


class TargetLauncher(Protocol):
    """Starts one proxy in front of ``upstream`` pinned to ``cpu`` and returns it once it answers."""

    @property
    def name(self) -> str: ...

    def launch(self, *, upstream: str, redis_url: str, cpu: int | None, log_dir: Path) -> Target: ...


@dataclass(frozen=True)
class UpstreamLauncher:
    """The fast fake upstream (``bench.gateway.upstream``)."""

    name: str = "upstream"

    def launch(self, *, cpu: int | None, log_dir: Path) -> Target:
        port = free_port()
        child = spawn(self.name, python_module("bench.gateway.upstream", "--port", str(port)), cpu=cpu, log_dir=log_dir)
        base = f"http://127.0.0.1:{port}"
        wait_http_ready(child, base + "/health")
        return Target("direct", base, child=child, note="fast fake OpenAI upstream (asyncio + httptools), no proxy")


@dataclass(frozen=True)
class PassthroughLauncher:
    """The minimal FastAPI + uvicorn + aiohttp pass-through (``bench.gateway.passthrough``)."""

    name: str = "passthrough"

    def launch(self, *, upstream: str, redis_url: str, cpu: int | None, log_dir: Path) -> Target:
        port = free_port()
        argv = python_module("bench.gateway.passthrough", "--port", str(port), "--upstream", upstream)
        child = spawn(self.name, argv, cpu=cpu, log_dir=log_dir)
        base = f"http://127.0.0.1:{port}"
        wait_http_ready(child, base + "/v1/models")
        return Target(
            self.name,
            base,
            child=child,
            note="minimal FastAPI/uvicorn + aiohttp pass-through, bytes through; streams relayed with Starlette's "
            "`StreamingResponse`",
        )


@dataclass(frozen=True)
class CommandLauncher:
    """Any proxy started by a shell-like command template with ``{port}`` and ``{upstream}`` placeholders;
    ready once ``GET /v1/models`` answers below 500."""

    name: str
    command: str
    api_key: str | None = None

    @classmethod
    def parse(cls, spec: str, index: int) -> CommandLauncher:
        """``NAME=COMMAND`` or just ``COMMAND`` (named ``proxy-<index>``)."""
        name, sep, command = spec.partition("=")
        if sep and name and " " not in name.strip():
            return cls(name=name.strip(), command=command.strip())
        return cls(name=f"proxy-{index}", command=spec.strip())

    def launch(self, *, upstream: str, redis_url: str, cpu: int | None, log_dir: Path) -> Target:
        port = free_port()
        argv = shlex.split(self.command.format(port=port, upstream=upstream, redis_url=redis_url))
        child = spawn(self.name, argv, cpu=cpu, log_dir=log_dir)
        base = f"http://127.0.0.1:{port}"
        wait_http_ready(child, base + "/v1/models", timeout_s=60.0)
        return Target(self.name, base, api_key=self.api_key, child=child, note=f"`{self.command}`")
