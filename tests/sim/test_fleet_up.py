"""Simulated workers run side by side (``workers.sim.fleet``) and ``gearshift up``'s component runner."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from typer.testing import CliRunner

from fleet.config import CommonSettings
from gearshift.cli.app import app
from gearshift.cli.up import Component, banner, build_components, run_components
from workers.sim.fleet import SimFleet

from .conftest import sim_settings

FLEET = {
    "models": [{"name": "kimi-k3", "profile": "kimi-k3-dspark-tp16", "context_window": 65536}],
    "workers": [
        {"id": "a", "url": "http://127.0.0.1:0", "model": "kimi-k3", "max_num_seqs": 32},
        {"id": "b", "url": "http://127.0.0.1:0", "model": "kimi-k3", "drafter": {"k_max": 4}},
        {"id": "gpu", "url": "http://10.0.0.9:8000", "model": "kimi-k3", "kind": "vllm"},
    ],
}


@pytest.fixture
def fleet_settings(tmp_path: Path) -> CommonSettings:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(FLEET))
    return CommonSettings(fleet_file=path, control_token="fleet-token")


async def test_up_starts_the_simulated_workers_of_the_fleet_file(fleet_settings: CommonSettings) -> None:
    components = build_components(fleet_settings, speedup=50, seed=3)
    assert [c.name for c in components] == ["simulated workers"]
    sims = components[0]
    assert isinstance(sims, SimFleet)
    assert [s.settings.worker_id for s in sims.servers] == ["a", "b"]
    assert [s.settings.seed for s in sims.servers] == [3, 4]
    stop = asyncio.Event()
    seen: dict[str, object] = {}

    def on_started(started: Sequence[Component]) -> None:
        seen["banner"] = banner(started, fleet_settings)
        stop.set()

    await run_components(components, stop, on_started=on_started)
    text = str(seen["banner"])
    assert all(url in text for url in sims.urls)
    assert "curl" in text
    assert "gpu" in text, "workers the embedded deployment cannot start are named"


async def test_fleet_workers_serve_streaming_chat_and_their_own_settings(fleet_settings: CommonSettings) -> None:
    (sims,) = build_components(fleet_settings, speedup=50)
    assert isinstance(sims, SimFleet)
    await sims.start()
    try:
        url_a, url_b = sims.urls
        async with openai.AsyncOpenAI(base_url=f"{url_a}/v1", api_key="x", max_retries=0) as client:
            stream = await client.chat.completions.create(
                model="kimi-k3", messages=[{"role": "user", "content": "hi"}], max_tokens=12, stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text
        async with httpx.AsyncClient() as http:
            a = (await http.get(f"{url_a}/gearshift/v1/speculation")).json()
            b = (await http.get(f"{url_b}/gearshift/v1/speculation")).json()
            put = await http.put(
                f"{url_b}/gearshift/v1/speculation",
                json={"k": 2, "version": 1},
                headers={"Authorization": "Bearer fleet-token"},
            )
        assert (a["k_max"], a["schedule"]) == (7, [[1, 32, 7]])
        assert (b["k_max"], b["schedule"]) == (4, [[1, 256, 4]])
        assert put.status_code == 200, "the fleet's control token comes from the common settings"
    finally:
        await sims.stop()
    async with httpx.AsyncClient() as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(f"{url_a}/health")


async def test_a_worker_that_cannot_bind_stops_the_ones_already_started() -> None:
    first = SimFleet([sim_settings(worker_id="x")])
    await first.start()
    try:
        port = first.servers[0].port
        clash = SimFleet([sim_settings(worker_id="y"), sim_settings(worker_id="z", port=port)])
        with pytest.raises(OSError):  # noqa: PT011 - the address-in-use errno differs between platforms
            await clash.start()
        y_url = f"http://127.0.0.1:{clash.servers[0].port}"
        async with httpx.AsyncClient() as http:
            with pytest.raises(httpx.ConnectError):
                await http.get(f"{y_url}/health")
    finally:
        await first.stop()


def test_sim_serve_rejects_bad_settings_naming_the_field() -> None:
    result = CliRunner().invoke(app, ["sim", "serve", "--speedup", "-1"])
    assert result.exit_code == 2
    assert "speedup" in result.output
