"""``/metrics`` for its readers only (issue 23, security pass): a bearer token when ``GEARSHIFT_METRICS_TOKEN`` is
set, and tenant labels as salted hashes under ``GEARSHIFT_METRICS_TENANT_LABEL=hash`` (every metric that labels a
tenant; ``gearshift top`` still finds each tenant's rate)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway.settings import GatewaySettings
from gateway.usage.metrics import GatewayMetrics
from gearshift.cli.top_model import Snapshot, parse_gateway, tenant_rows

from .harness import ADMIN_KEY, MODEL, PEPPER, StartUpstreams, make_fleet, make_tenants, serve_gateway

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
TENANT_LABELLED = {
    "gearshift_gateway_requests",
    "gearshift_gateway_tokens",
    "gearshift_gateway_cost_usd",
    "gearshift_gateway_admission_rejections",
}


def _tenant_labels(text: str) -> dict[str, set[str]]:
    """Metric family → the values of its ``tenant`` label."""
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "tenant" in sample.labels:
                found.setdefault(family.name.removesuffix("_created"), set()).add(sample.labels["tenant"])
    return found


async def test_metrics_are_open_by_default_and_need_the_token_once_one_is_set(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, g.client(None) as c:
        assert (await c.get("/metrics")).status_code == 200
    token = "metrics-token-" + "x" * 24
    async with serve_gateway(make_fleet([w.url]), make_tenants(), metrics_token=token) as g, g.client(None) as c:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": f"Bearer {ADMIN_KEY}"}):
            r = await c.get("/metrics", headers=headers)
            assert r.status_code == 401, headers
            assert r.json()["error"]["type"] == "authentication_error"
            assert "gearshift_gateway" not in r.text
        r = await c.get("/metrics", headers={"authorization": f"Bearer {token}"})
        assert r.status_code == 200
        assert "gearshift_gateway_store_up" in r.text


async def test_hashed_tenant_labels_carry_no_tenant_id_and_are_equal_on_every_replica(
    upstreams: StartUpstreams,
) -> None:
    (w,) = await upstreams(1)
    tenants = make_tenants(alpha={"rpm": 1})
    label = GatewaySettings(key_pepper=PEPPER, metrics_tenant_label="hash").tenant_labeler()
    texts = []
    for _ in range(2):  # two replicas: the same label
        async with serve_gateway(make_fleet([w.url]), tenants, metrics_tenant_label="hash") as g, g.client() as c:
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 429
            texts.append((await c.get("/metrics")).text)
    for text in texts:
        labels = _tenant_labels(text)
        assert set(labels) == TENANT_LABELLED
        assert all(values == {label("alpha")} for values in labels.values()), labels
        assert 'tenant="alpha"' not in text
    assert label("alpha").startswith("t-")
    assert label("alpha") != label("beta")
    other = GatewaySettings(key_pepper=PEPPER + "-other", metrics_tenant_label="hash").tenant_labeler()
    assert other("alpha") != label("alpha"), "the hash is keyed: another pepper, another label"


async def test_ids_stay_the_default_label(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, g.client() as c:
        assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
        labels = _tenant_labels((await c.get("/metrics")).text)
    assert labels["gearshift_gateway_requests"] == {"alpha"}


def test_top_finds_each_tenants_rate_under_hashed_labels() -> None:
    label = GatewaySettings(key_pepper=PEPPER, metrics_tenant_label="hash").tenant_labeler()
    metrics = GatewayMetrics(tenant_label=label)
    before = parse_gateway(metrics.exposition().decode())
    metrics.requests.labels(label("alpha"), MODEL, "w0", "ok").inc(20)
    after = parse_gateway(metrics.exposition().decode())
    prev, cur = Snapshot(at_s=0.0, workers={}, gateway=before), Snapshot(at_s=10.0, workers={}, gateway=after)
    rows = {row.tenant: row.requests_per_s for row in tenant_rows(prev, cur, make_tenants(), label)}
    assert rows["alpha"] == 2.0
    assert rows["beta"] == 0.0
    unlabelled = {row.tenant: row.requests_per_s for row in tenant_rows(prev, cur, make_tenants())}
    assert unlabelled["alpha"] == 0.0, "read with ids, a hashed exposition has no tenant 'alpha'"
