"""The speculation-control client against a real simulated worker on loopback (DESIGN §3.1)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest

from fleet.speculation import SPECULATION_PATH, SpeculationUpdate
from fleet.speculation_client import SpeculationCallError, SpeculationClient
from workers.sim.server import SimServer
from workers.sim.settings import SimWorkerSettings

TOKEN = "fleet-test-control"


@pytest.fixture
async def worker_url() -> AsyncIterator[str]:
    server = SimServer(SimWorkerSettings(worker_id="w-1", port=0, start_k=7, control_token=TOKEN))
    await server.start()
    yield server.url
    await server.stop()


async def test_reads_and_updates_with_version_and_lease(worker_url: str) -> None:
    async with httpx.AsyncClient() as http:
        client = SpeculationClient(http, control_token=TOKEN, timeout_s=5.0)
        start = await client.state(worker_url + "/")
        assert (start.worker_id, start.schedule) == ("w-1", start.fallback_schedule)
        applied = await client.update(worker_url, SpeculationUpdate(k=3, version=start.version + 1, reason="t"))
        assert applied.schedule == [[1, applied.schedule[0][1], 3]]
        assert applied.lease_expires_at == pytest.approx(applied.applied_at + 30.0)
        assert await client.state(worker_url) == applied


async def test_refusals_carry_the_status(worker_url: str) -> None:
    async with httpx.AsyncClient() as http:
        client = SpeculationClient(http, control_token=TOKEN)
        await client.update(worker_url, SpeculationUpdate(k=2, version=5))
        with pytest.raises(SpeculationCallError, match="HTTP 409") as stale:
            await client.update(worker_url, SpeculationUpdate(k=2, version=4))
        assert stale.value.stale_version
        with pytest.raises(SpeculationCallError, match="HTTP 400") as bad:
            await client.update(worker_url, SpeculationUpdate(k=99, version=6))
        assert (bad.value.status, bad.value.stale_version) == (400, False)
        with pytest.raises(SpeculationCallError, match=re.escape(f"PUT {worker_url}{SPECULATION_PATH}: HTTP 401")):
            await SpeculationClient(http, control_token="wrong").update(worker_url, SpeculationUpdate(k=1, version=6))


async def test_no_answer_and_a_body_that_is_not_a_state_are_errors_without_a_status() -> None:
    async with httpx.AsyncClient() as http:
        with pytest.raises(SpeculationCallError, match=re.escape("GET http://127.0.0.1:9")) as unreachable:
            await SpeculationClient(http, control_token=TOKEN, timeout_s=0.5).state("http://127.0.0.1:9")
    assert unreachable.value.status is None
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json={"worker_id": "w"}))
    async with httpx.AsyncClient(transport=transport) as http:
        with pytest.raises(SpeculationCallError, match="bad response body") as garbled:
            await SpeculationClient(http, control_token=TOKEN).state("http://worker")
    assert garbled.value.status is None
