"""Telemetry: OpenTelemetry spans (GenAI semantic conventions) and bounded Prometheus labels."""

from __future__ import annotations

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client.parser import text_string_to_metric_families

from gateway.settings import GatewaySettings
from gateway.usage.tracing import build_tracing

from .harness import MODEL, StartUpstreams, make_fleet, make_tenants, serve_gateway

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


async def test_spans_for_request_admission_routing_and_upstream(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    exporter = InMemorySpanExporter()
    async with serve_gateway(make_fleet([w.url]), make_tenants(), span_exporter=exporter) as g, g.client() as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert r.status_code == 200
    spans = {(s.name, s.kind): s for s in exporter.get_finished_spans()}
    server = spans[(f"chat {MODEL}", SpanKind.SERVER)]
    client = spans[(f"chat {MODEL}", SpanKind.CLIENT)]
    admission = spans[("gearshift.admission", SpanKind.INTERNAL)]
    routing = spans[("gearshift.routing", SpanKind.INTERNAL)]
    assert server.attributes is not None
    assert server.attributes["gen_ai.operation.name"] == "chat"
    assert server.attributes["gen_ai.request.model"] == MODEL
    assert server.attributes["gen_ai.usage.input_tokens"] == 7
    assert server.attributes["gen_ai.usage.output_tokens"] == 3
    assert server.attributes["gearshift.tenant"] == "alpha"
    assert client.attributes is not None
    assert client.attributes["gearshift.worker.id"] == "w0"
    for child in (client, admission, routing):
        assert child.parent is not None
        assert child.parent.span_id == server.context.span_id


async def test_failed_request_span_has_error_status(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    exporter = InMemorySpanExporter()
    tenants = make_tenants(alpha={"rpm": 1})
    async with serve_gateway(make_fleet([w.url]), tenants, span_exporter=exporter) as g, g.client() as c:
        await c.post("/v1/chat/completions", json=CHAT)
        assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 429
    failed = {s.name: s for s in exporter.get_finished_spans() if s.status.status_code is StatusCode.ERROR}
    assert set(failed) == {f"chat {MODEL}", "gearshift.admission"}
    server = failed[f"chat {MODEL}"]
    assert server.attributes is not None
    assert server.attributes["error.type"] == "RateLimited"
    assert failed["gearshift.admission"].attributes == {
        "gearshift.reserved_tokens": 1 + 4 * 2 + 3,
        "gearshift.limit": "rpm",
    }


def test_tracing_is_off_unless_configured() -> None:
    tracing = build_tracing(GatewaySettings())
    assert tracing.tracer is None
    tracing.shutdown()
    assert build_tracing(GatewaySettings(), exporter=InMemorySpanExporter()).tracer is not None


async def test_metric_labels_are_bounded(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, g.client() as c:
        for i in range(3):
            headers = {"x-request-id": f"unique-{i}"}
            await c.post("/v1/chat/completions", json={**CHAT, "stream": bool(i % 2)}, headers=headers)
        await c.post("/v1/chat/completions", json={**CHAT, "model": "no-such-model-123"})
        text = (await c.get("/metrics")).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = families["gearshift_gateway_requests"]
    assert {s.value for s in requests.samples if s.name.endswith("_total")} == {3.0}
    labels = {k for f in families.values() for s in f.samples for k in s.labels}
    assert labels <= {
        "tenant",
        "model",
        "worker",
        "status",
        "kind",
        "tier",
        "reason",
        "type",
        "cause",
        "loop",
        "le",
        "outcome",
        "pool",
        "speculation",  # auto, off or fast (fleet.config.SpeculationMode)
    }
    values = {v for f in families.values() for s in f.samples for v in s.labels.values()}
    assert not any("unique-" in v or "no-such-model" in v for v in values)
    ttft = families["gearshift_gateway_time_to_first_token_seconds"]
    assert any(
        s.labels.get("tier") == "interactive" and s.name.endswith("_count") and s.value == 1 for s in ttft.samples
    )


async def test_spans_are_exported_over_otlp_when_configured(upstreams: StartUpstreams) -> None:
    """A real OTLP/HTTP receiver on loopback gets the request's spans (protobuf) when the endpoint is set."""
    (w,) = await upstreams(1)
    received: list[ExportTraceServiceRequest] = []

    async def collect(request: web.Request) -> web.Response:
        received.append(ExportTraceServiceRequest.FromString(await request.read()))
        return web.Response(status=200, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", collect)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    endpoint = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/traces"
    try:
        async with serve_gateway(make_fleet([w.url]), make_tenants(), otlp_endpoint=endpoint) as g, g.client() as c:
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
        # stopping the gateway flushed the batch
        names = {s.name for req in received for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans}
        services = {
            a.value.string_value for req in received for rs in req.resource_spans for a in rs.resource.attributes
            if a.key == "service.name"
        }  # fmt: skip
    finally:
        await runner.cleanup()
    assert names == {f"chat {MODEL}", "gearshift.admission", "gearshift.routing"}
    assert services == {"gearshift-gateway"}
