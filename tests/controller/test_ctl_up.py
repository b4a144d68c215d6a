"""``gearshift up`` runs the controller beside the simulated workers, on the store the gateway shares."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from bench.procs import free_port
from controller.app import ControllerComponent
from fleet.clock import SystemClock
from fleet.config import CommonSettings
from fleet.store.memory import MemoryStore
from gearshift.cli.up import SharedStore, build_components, controller_components, run_components


async def test_up_controller_publishes_worker_state_to_the_shared_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    fleet = {
        "models": [{"name": "kimi-k3"}],
        "workers": [{"id": "up-0", "url": f"http://127.0.0.1:{port}", "model": "kimi-k3"}],
    }
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    monkeypatch.setenv("GEARSHIFT_METRICS_PORT", "0")
    monkeypatch.setenv("GEARSHIFT_TICK_S", "0.1")
    monkeypatch.setenv("GEARSHIFT_STABILISER__PROBE_S", "0.2")
    settings = CommonSettings(fleet_file=tmp_path / "fleet.yaml")
    shared = SharedStore(MemoryStore(clock=SystemClock()), redis=False)
    components = [*build_components(settings, speedup=20), shared]
    (controller,) = controller_components(settings, components)
    assert isinstance(controller, ControllerComponent)
    assert controller.store is shared.store
    stop = asyncio.Event()

    async def published() -> None:
        for _ in range(200):
            states = await shared.store.worker_states()
            if "up-0" in states and states["up-0"].k_applied == 7 and not states["up-0"].stale:
                stop.set()
                return
            await asyncio.sleep(0.02)
        stop.set()

    await asyncio.gather(run_components([*components, controller], stop), published())
    state = (await shared.store.worker_states())["up-0"]
    assert state.k_applied == 7
    assert not state.stale
