"""The served OpenAPI document lists the tenants file's tiers as the only ``tier`` of the admin API's tenant bodies
(so a fuzzer generates bodies the gateway accepts), for each gateway's own file, and every listed tier is one the
gateway accepts."""

from __future__ import annotations

from typing import Any

import httpx

from fleet.config import TierConfig

from .harness import StartUpstreams, make_fleet, make_tenants, serve_gateway


def _tier_schemas(doc: dict[str, Any]) -> list[dict[str, Any]]:
    paths = doc["paths"]
    bodies = [paths["/admin/v1/tenants"]["post"], paths["/admin/v1/tenants/{tenant_id}"]["patch"]]
    return [op["requestBody"]["content"]["application/json"]["schema"]["properties"]["tier"] for op in bodies]


async def test_the_tenant_bodies_tier_is_an_enum_of_the_tenants_files_tiers(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    file = make_tenants()
    other = file.model_copy(update={"tiers": {**file.tiers, "gold": TierConfig(priority=-1)}})
    async with (
        serve_gateway(make_fleet([w.url]), file) as g,
        serve_gateway(make_fleet([w.url]), other) as h,
        g.admin() as a,
        httpx.AsyncClient(base_url=h.url) as b,
    ):
        doc = (await a.get("/openapi.json")).json()
        other_doc = (await b.get("/openapi.json")).json()
        for i, tier in enumerate(_tier_schemas(doc)[0]["enum"]):
            r = await a.post("/admin/v1/tenants", json={"id": f"t{i}", "tier": tier})
            assert r.status_code == 201, r.text
    assert [s["enum"] for s in _tier_schemas(doc)] == [sorted(file.tiers)] * 2
    assert [s["enum"] for s in _tier_schemas(other_doc)] == [sorted(other.tiers)] * 2, "each gateway its own file"
    assert _tier_schemas(doc)[0]["type"] == "string"
