"""The soak's transport errors are classified (exception, phase, pooled or new connection), and its clients' pool
never reuses a connection the gateway may be closing (issue 23: 446 unexplained transport errors)."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from bench.procs import free_port
from bench.soak import report as soak_report
from bench.soak.client import StreamResult, connection_tracing, stream_chat
from bench.soak.run import CLIENT_KEEPALIVE_S, Finished, SoakConfig, SoakResult
from gateway.settings import GatewaySettings
from tests.gateway.harness import MODEL, FakeUpstream

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def test_the_clients_never_reuse_a_connection_past_half_the_gateways_keep_alive() -> None:
    gateway_keep_alive_s = GatewaySettings.model_fields["keep_alive_s"].default
    assert gateway_keep_alive_s >= CLIENT_KEEPALIVE_S * 2


async def test_each_result_says_whether_its_connection_was_pooled() -> None:
    worker = await FakeUpstream(chunks=3).start()
    try:
        async with aiohttp.ClientSession(trace_configs=[connection_tracing()]) as session:
            first = await stream_chat(session, worker.url, key="k", body=BODY)
            second = await stream_chat(session, worker.url, key="k", body=BODY)
            refused = await stream_chat(session, f"http://127.0.0.1:{free_port()}", key="k", body=BODY)
    finally:
        await worker.stop()
    assert first.ok
    assert second.ok
    assert (first.reused, second.reused) == (False, True)
    assert (first.phase, refused.phase) == (None, "connect")


def _failed(at_s: float, error: str, *, status: int = 0, reused: bool | None = True, gateway: int = 0) -> Finished:
    result = StreamResult(status=status, started=at_s - 0.5, ended=at_s, transport_error=error, reused=reused)
    return Finished(at_s=at_s, tenant="acme", result=result, gateway=gateway)


def test_transport_errors_are_grouped_by_exception_phase_and_connection(tmp_path: Path) -> None:
    reset = "ClientOSError(104, 'Connection reset by peer')"
    finished = [
        _failed(10.0, reset),
        _failed(12.0, reset, gateway=1),
        _failed(13.0, "ClientPayloadError('Response payload is not completed')", status=200, reused=False),
        _failed(14.0, "ClientConnectorError(ConnectionKey(...), ConnectionRefusedError(111))", reused=None),
        Finished(at_s=15.0, tenant="acme", result=StreamResult(status=200, started=14.0, ended=15.0, done=True)),
    ]
    result = SoakResult(config=SoakConfig(), started_wall=0.0, finished=finished)
    rows = soak_report.transport_rows(result)
    assert [row[:4] for row in rows] == [
        ["ClientOSError", "before the response", "pooled", "2"],
        ["ClientPayloadError", "mid-body", "new", "1"],
        ["ClientConnectorError", "connect", "?", "1"],
    ]
    assert rows[0][5:7] == ["10–12", "gateway-0: 1, gateway-1: 1"]
    page = soak_report.write(result, tmp_path, command="test").read_text()
    assert "## Transport errors" in page
    assert "| ClientOSError | before the response | pooled | 2 |" in page
