"""On the real CPU engine: the model workers are asked what they capture, and an eager build advertises no limit.

The question crosses every process of vLLM's default layout (API server → EngineCore utility call →
``collective_rpc`` into the model worker), the path a GPU worker takes to its Model Runner V2 graph manager.
The CPU runner (V1-based, eager) has no such manager, so the answer is "every gear alike": ``full_speed`` null.
"""

from __future__ import annotations

import httpx
import pytest

from fleet.speculation import SPECULATION_PATH
from workers.vllm.cpu_server import RunningServer

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


async def test_an_eager_worker_advertises_every_gear(vllm_server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=vllm_server.url, timeout=60.0) as client:
        response = await client.get(SPECULATION_PATH)
    assert response.status_code == 200, response.text
    assert response.json()["full_speed"] is None
    log = vllm_server.log_path.read_text(errors="replace")
    assert "no shape-dependent decode graphs (eager or Model Runner V1): every gear runs alike" in log
    assert "asking the model workers for their captured decode graphs failed" not in log
