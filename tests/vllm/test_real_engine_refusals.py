"""The plugin on a real vLLM CPU engine started WITHOUT a per-batch-size table: it refuses control clearly
(409 naming the missing setting, an error in vLLM's log) and the engine serves as if it were not there."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from bench.procs import free_port
from fleet.speculation import SPECULATION_PATH
from workers.vllm.cpu_server import RunningServer, tiny_worker

from .conftest import CONTROL_TOKEN, start_server

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

TABLE = "num_speculative_tokens_per_batch_size"


@pytest.fixture(scope="module")
def server_without_table(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    worker = tiny_worker(port=free_port(), model_dir=tiny_model_dir)
    log_dir = tmp_path_factory.mktemp("vllm-no-table")
    yield from start_server(worker, log_dir, in_process_worker=True, speculative_extra={TABLE: None})


@pytest.fixture
async def client(server_without_table: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server_without_table.url, timeout=60.0) as c:
        yield c


async def test_get_and_put_are_409_naming_the_missing_table(client: httpx.AsyncClient) -> None:
    auth = {"Authorization": f"Bearer {CONTROL_TOKEN}"}
    for response in (
        await client.get(SPECULATION_PATH),
        await client.put(SPECULATION_PATH, json={"k": 1, "version": 1}, headers=auth),
    ):
        assert response.status_code == 409
        error = response.json()["error"]
        assert (error["type"], error["param"]) == ("ConflictError", "speculative_config")
        assert TABLE in error["message"]


async def test_the_engine_serves_and_logs_the_refusal(
    client: httpx.AsyncClient, server_without_table: RunningServer
) -> None:
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 24, "temperature": 0.0, "ignore_eos": True}
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 24
    assert (await client.get("/health")).status_code == 200
    log = server_without_table.log_path.read_text(errors="replace").splitlines()
    refusals = [line for line in log if "started without a per-batch-size table" in line]
    assert refusals, "the refusal was not logged"
    assert all(" ERROR " in line for line in refusals), refusals
