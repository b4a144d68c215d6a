"""Tiers at run time through a real gateway (memory store): read and change a tier's fields, validated like the
tenants file with the error naming the field, applied to the next request, audited, kept across a restart
until the file's tier changes; and each tenant's spend to date in the tenant views."""

from __future__ import annotations

from typing import Any

import httpx

from fleet.config import TierConfig
from fleet.store.keys import spend_key
from fleet.store.memory import MemoryStore

from .harness import ADMIN_KEY, KEYS, MODEL, StartUpstreams, make_fleet, make_tenants, serve_gateway

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def admin(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10.0)


async def chat(url: str, tenant: str) -> int:
    async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {KEYS[tenant]}"}) as c:
        return (await c.post("/v1/chat/completions", json=CHAT)).status_code


def by_name(listing: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in listing["data"]}


async def test_a_tier_change_applies_to_the_next_request_and_is_audited(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, admin(g.url) as a:
        tiers = by_name((await a.get("/admin/v1/tiers")).json())
        assert set(tiers) == {"interactive", "batch"}
        assert tiers["interactive"]["config"] == TierConfig(
            priority=0, tpot_target_s=0.05, speculation="speed"
        ).model_dump(mode="json")
        assert tiers["interactive"]["changed_at_runtime"] is False
        assert await chat(g.url, "alpha") == 200
        assert w.bodies[-1]["priority"] == 0
        r = await a.patch("/admin/v1/tiers/interactive", json={"priority": 3, "tpot_target_s": 0.08})
        assert r.status_code == 200, r.text
        view = r.json()
        assert (view["config"]["priority"], view["config"]["tpot_target_s"], view["config"]["prefer"]) == (
            3,
            0.08,
            "speed",
        )
        assert (view["changed_at_runtime"], view["changed_by"]) == (True, "admin")
        assert g.gw.tenants.tiers["interactive"].priority == 3
        assert await chat(g.url, "alpha") == 200
        assert w.bodies[-1]["priority"] == 3  # the changed tier's, at once
        trail = (await a.get("/admin/v1/audit")).json()["data"]
        assert [(e["action"], e["target"], e["details"]) for e in trail] == [
            ("tier.update", "interactive", {"changes": {"priority": 3, "tpot_target_s": 0.08}})
        ]


async def test_tier_bodies_are_validated_like_the_tenants_file_and_errors_name_the_field(
    upstreams: StartUpstreams,
) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, admin(g.url) as a:
        cases = [
            ({"tpot_target_s": -1}, "tpot_target_s"),
            ({"ttft_target_s": 0}, "ttft_target_s"),
            ({"speculation": "fastest"}, "speculation"),
            ({"brownout_max_tokens": 0}, "brownout_max_tokens"),
            ({"colour": "red"}, "colour"),
        ]
        for body, field in cases:
            r = await a.patch("/admin/v1/tiers/batch", json=body)
            assert r.status_code == 400, (body, r.text)
            error = r.json()["error"]
            assert error["param"] == field, error
            assert error["message"].split(": ")[1] == field, error
        assert (await a.patch("/admin/v1/tiers/gold", json={"priority": 1})).status_code == 404
        assert (await a.get("/admin/v1/audit")).json()["data"] == []  # refused changes leave no trace
        async with httpx.AsyncClient(base_url=g.url, headers={"authorization": f"Bearer {KEYS['alpha']}"}) as t:
            assert (await t.patch("/admin/v1/tiers/batch", json={"priority": 1})).status_code == 401


async def test_a_tier_change_survives_a_restart_until_the_files_tier_changes(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    store = MemoryStore()
    fleet = make_fleet([w.url])
    async with serve_gateway(fleet, make_tenants(), store=store) as g, admin(g.url) as a:
        await a.patch("/admin/v1/tiers/batch", json={"sheddable": False})
    async with serve_gateway(fleet, make_tenants(), store=store) as g, admin(g.url) as a:
        batch = by_name((await a.get("/admin/v1/tiers")).json())["batch"]
        assert (batch["config"]["sheddable"], batch["changed_at_runtime"]) == (False, True)
    edited = make_tenants()
    edited = edited.model_copy(update={"tiers": {**edited.tiers, "batch": TierConfig(priority=20, sheddable=True)}})
    async with serve_gateway(fleet, edited, store=store) as g, admin(g.url) as a:
        batch = by_name((await a.get("/admin/v1/tiers")).json())["batch"]
        assert (batch["config"]["priority"], batch["config"]["sheddable"]) == (20, True)
        assert (batch["superseded"], batch["changed_at_runtime"]) == (True, False)


async def test_tenant_views_carry_the_spend_to_date(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, admin(g.url) as a:
        assert (await a.get("/admin/v1/tenants/alpha")).json()["spent_usd"] == 0.0
        await g.store.settle(windows=(), slots=(), spend={spend_key("alpha"): 1.25}, now=g.gw.clock.wall())
        assert (await a.get("/admin/v1/tenants/alpha")).json()["spent_usd"] == 1.25
        listed = {t["id"]: t["spent_usd"] for t in (await a.get("/admin/v1/tenants")).json()["data"]}
        assert listed == {"alpha": 1.25, "beta": 0.0, "gamma": 0.0}
        await a.post("/admin/v1/tenants/alpha/budget/reset")
        assert (await a.get("/admin/v1/tenants/alpha")).json()["spent_usd"] == 0.0
