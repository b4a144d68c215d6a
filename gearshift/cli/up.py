"""``gearshift up``: every part of the embedded default deployment in one process, on one event loop.

The deployment is a list of components, each with ``start``/``stop``/``describe``; they start in order,
run until Ctrl-C (or SIGTERM), and stop in reverse order. This issue contributes the simulated workers;
the gateway and the controller add their components to ``build_components``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Sequence
from typing import Protocol

import typer
import uvloop

from controller.app import ControllerComponent, controller_settings_from
from fleet.clock import SystemClock
from fleet.config import CommonSettings
from fleet.store.factory import build_store
from fleet.store.protocol import Store
from gateway.http.serve import GatewayServer, client_snippet
from gateway.settings import GatewaySettings
from gateway.wiring import GatewayDeps
from workers.sim.fleet import SimFleet, fleet_worker_settings

DEMO_KEY = "gs-demo-key"
"""The demo tenant's key in the embedded tenants file (its digest is under the development pepper)."""


class Component(Protocol):
    """A long-running part of the deployment."""

    name: str

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def describe(self) -> list[str]:
        """Lines telling an operator how to reach this component."""
        ...


def build_components(settings: CommonSettings, *, speedup: float = 1.0, seed: int = 0) -> list[Component]:
    """The components of the deployment ``settings`` describes (simulated workers, for now)."""
    sims = fleet_worker_settings(settings.fleet(), seed=seed, speedup=speedup, control_token=settings.control_token)
    components: list[Component] = []
    if sims:
        components.append(SimFleet(sims))
    return components


def gateway_components(settings: CommonSettings) -> list[Component]:
    """The shared store and the gateway in front of the fleet's workers (GatewaySettings from the environment)."""
    clock = SystemClock()
    store = SharedStore(build_store(settings, clock=clock), redis=bool(settings.redis_url))
    gateway = GatewayServer(
        GatewayDeps(
            GatewaySettings(), store=store.store, clock=clock, fleet=settings.fleet(), tenants=settings.tenants()
        ),
        handle_signals=False,
    )
    return [store, gateway]


def controller_components(settings: CommonSettings, started: Sequence[Component]) -> list[Component]:
    """The speculation controller on the store the gateway uses (ControllerSettings from the environment)."""
    shared = next((c for c in started if isinstance(c, SharedStore)), None)
    store = shared.store if shared is not None else None
    return [ControllerComponent(controller_settings_from(settings), store=store)]


class SharedStore:
    """The store the gateway and the controller share: process memory, or Redis with GEARSHIFT_REDIS_URL."""

    name = "store"

    def __init__(self, store: Store, *, redis: bool) -> None:
        self.store = store
        self._redis = redis

    async def start(self) -> None:
        if not await self.store.ping():
            raise RuntimeError("the store does not answer (check GEARSHIFT_REDIS_URL)")

    async def stop(self) -> None:
        await self.store.close()

    def describe(self) -> list[str]:
        return ["Redis (GEARSHIFT_REDIS_URL)" if self._redis else "in process memory"]


async def run_components(
    components: Sequence[Component],
    stop: asyncio.Event,
    *,
    on_started: Callable[[Sequence[Component]], None] = lambda _: None,
) -> None:
    """Start ``components`` in order, wait for ``stop``, then stop the started ones in reverse order."""
    started: list[Component] = []
    try:
        for component in components:
            await component.start()
            started.append(component)
        on_started(started)
        await stop.wait()
    finally:
        for component in reversed(started):
            await component.stop()


def banner(components: Sequence[Component], settings: CommonSettings) -> str:
    lines = ["gearshift is up."]
    for c in components:
        lines.append(f"{c.name}:")
        lines += [f"  {line}" for line in c.describe()]
    fleet = settings.fleet()
    sim = next((c for c in components if isinstance(c, SimFleet)), None)
    if sim is not None and sim.servers:
        url, model = sim.urls[0], sim.servers[0].settings.model
        lines += [
            "",
            "Try it:",
            f"  curl -N {url}/v1/chat/completions -H 'Content-Type: application/json' \\",
            f'    -d \'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}], '
            '"max_tokens": 64, "stream": true}\'',
            f"  curl {url}/metrics | grep spec_decode",
        ]
    gateway = next((c for c in components if isinstance(c, GatewayServer)), None)
    if gateway is not None and fleet.models:
        snippet = client_snippet(gateway.url, model=fleet.models[0].name, api_key=DEMO_KEY)
        lines += ["", "Through the gateway with the openai client (paste into python):", "", snippet, ""]
    others = [w.id for w in fleet.workers if w.kind != "sim"]
    if others:
        lines.append(f"Not started here (run them with vLLM): {', '.join(others)}")
    lines.append("Press Ctrl-C to stop.")
    return "\n".join(lines)


def run_until_signalled(components: Sequence[Component], on_started: Callable[[Sequence[Component]], None]) -> None:
    """Run ``components`` on a fresh event loop (uvloop) until SIGINT or SIGTERM."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_components(components, stop, on_started=on_started)

    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


def up(
    speedup: float = typer.Option(1.0, min=0.001, help="Simulated seconds per real second for the simulated workers."),
    seed: int = typer.Option(0, help="Base seed of the simulated workers (worker i uses seed + i)."),
) -> None:
    """Start the embedded deployment (the fleet file's simulated workers on loopback) until Ctrl-C."""
    settings = CommonSettings()
    components = build_components(settings, speedup=speedup, seed=seed)
    if not components:
        raise typer.BadParameter("the fleet file has no simulated workers and nothing else to start")
    components += gateway_components(settings)
    components += controller_components(settings, components)
    run_until_signalled(components, lambda started: typer.echo(banner(started, settings)))


def register(root: typer.Typer) -> None:
    """Add ``gearshift up`` to the root command."""
    root.command("up")(up)
