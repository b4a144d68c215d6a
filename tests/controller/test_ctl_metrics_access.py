"""The controller's own ``/metrics`` (``controller.app``) for its readers only: open by default, and with
``GEARSHIFT_METRICS_TOKEN`` set only for ``Authorization: Bearer <it>``, as the gateway's. A real controller
component serves it on 127.0.0.1 against a simulated worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from bench.procs import free_port
from controller.app import ControllerComponent
from controller.settings import ControllerSettings
from fleet.bearer import bearer_header
from workers.sim.server import SimServer

from .ctl_helpers import CONTROL_TOKEN
from .test_ctl_cli import fleet_file

TOKEN = "metrics-token-" + "x" * 24


@asynccontextmanager
async def serving(settings: ControllerSettings) -> AsyncIterator[httpx.AsyncClient]:
    component = ControllerComponent(settings)
    await component.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{settings.metrics_port}") as client:
            yield client
    finally:
        await component.stop()


def settings_for(tmp_path: Path, sim: SimServer, *, metrics_token: str | None = None) -> ControllerSettings:
    return ControllerSettings(
        fleet_file=fleet_file(tmp_path, sim.url), tick_s=0.2, dry_run=True, control_token=CONTROL_TOKEN,
        metrics_host="127.0.0.1", metrics_port=free_port(), metrics_token=metrics_token,
    )  # fmt: skip


async def test_the_metrics_are_open_without_a_token(sim_server: SimServer, tmp_path: Path) -> None:
    async with serving(settings_for(tmp_path, sim_server)) as client:
        r = await client.get("/metrics")
        assert r.status_code == 200
        assert "gearshift_controller_" in r.text


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, bearer_header(CONTROL_TOKEN)])
async def test_with_a_token_set_the_metrics_need_it(
    sim_server: SimServer, tmp_path: Path, headers: dict[str, str]
) -> None:
    async with serving(settings_for(tmp_path, sim_server, metrics_token=TOKEN)) as client:
        refused = await client.get("/metrics", headers=headers)
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "authentication_error"
        assert "gearshift_controller_" not in refused.text
        allowed = await client.get("/metrics", headers=bearer_header(TOKEN))
        assert allowed.status_code == 200
        assert "gearshift_controller_" in allowed.text


def test_the_token_is_read_from_gearshift_metrics_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEARSHIFT_METRICS_TOKEN", TOKEN)
    token = ControllerSettings().metrics_token
    assert token is not None
    assert token.get_secret_value() == TOKEN
