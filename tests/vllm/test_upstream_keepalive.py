"""The gateway lets a pooled upstream connection go before a vLLM worker closes it.

vLLM's API server (uvicorn) closes an idle connection ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` seconds after its last
response. A request the gateway writes on a pooled connection in the moment the worker closes it gets no
response: it fails before its first byte, is retried elsewhere and counts as the worker's failure (enough of them
eject it). So the gateway's pool must drop an idle connection first. Read off vLLM 0.32's source (parsed, not
imported), against the pool ``gateway.upstream.client.new_session`` builds.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gateway.settings import GatewaySettings
from gateway.upstream.client import new_session
from workers.vllm.cpu_server import VLLM_VENV

pytestmark = pytest.mark.vllm


def vllm_keep_alive_default_s() -> float:
    """The default of ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` in ``vllm/envs.py``'s environment table."""
    (path,) = sorted(VLLM_VENV.glob("lib/python3.*/site-packages/vllm/envs.py"))
    tree = ast.parse(Path(path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "VLLM_HTTP_TIMEOUT_KEEP_ALIVE":
                    default = next(
                        c.args[1] for c in ast.walk(value) if isinstance(c, ast.Call) and len(c.args) == 2
                    )  # os.environ.get("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "5")
                    assert isinstance(default, ast.Constant)
                    assert isinstance(default.value, str)
                    return float(default.value)
    raise AssertionError("VLLM_HTTP_TIMEOUT_KEEP_ALIVE not found in vllm/envs.py")


async def test_the_gateway_drops_an_idle_upstream_connection_before_a_vllm_worker_does() -> None:
    settings = GatewaySettings()
    session = new_session(settings)
    try:
        connector = session.connector
        assert connector is not None
        pool_idle_s = connector._keepalive_timeout  # aiohttp's BaseConnector(keepalive_timeout=…)
        assert settings.upstream_keep_alive_s == pool_idle_s
        assert pool_idle_s < vllm_keep_alive_default_s()
    finally:
        await session.close()
