"""Tenants at run time through a real gateway (memory store): the admin CRUD, validation like the tenants file,
suspension, budgets raised and reset, the audit trail with named admin keys, and precedence over the file across
a restart."""

from __future__ import annotations

from typing import Any

import httpx

from fleet.config import TenantConfig
from fleet.store.keys import spend_key
from fleet.store.memory import MemoryStore
from gateway.http.tenants_admin import TenantView

from .harness import ADMIN_KEY, KEYS, MODEL, StartUpstreams, make_fleet, make_tenants, serve_gateway

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def admin(url: str, key: str = ADMIN_KEY) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=10.0)


async def chat_status(url: str, tenant: str) -> tuple[int, dict[str, Any]]:
    async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {KEYS[tenant]}"}) as c:
        r = await c.post("/v1/chat/completions", json=CHAT)
        return r.status_code, r.json()


async def test_create_issue_a_key_change_and_delete_a_tenant(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, admin(g.url) as a:
        r = await a.post("/admin/v1/tenants", json={"id": "delta", "tier": "batch", "rpm": 2, "models": [MODEL]})
        assert r.status_code == 201, r.text
        view = r.json()
        assert view["source"] == "runtime"
        assert view["rpm"] == 2
        assert view["changed_by"] == "admin"
        assert (await a.post("/admin/v1/tenants", json={"id": "delta", "tier": "batch"})).status_code == 409
        secret = (await a.post("/admin/v1/keys", json={"tenant": "delta"})).json()["secret"]
        async with httpx.AsyncClient(base_url=g.url, headers={"authorization": f"Bearer {secret}"}) as c:
            assert [(await c.post("/v1/chat/completions", json=CHAT)).status_code for _ in range(3)] == [200, 200, 429]
            r = await a.patch("/admin/v1/tenants/delta", json={"rpm": None, "tier": "interactive"})
            assert r.status_code == 200, r.text
            assert r.json()["rpm"] is None
            assert r.json()["tier"] == "interactive"
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
            assert w.bodies[-1]["priority"] == 0  # the interactive tier's, at once
            assert (await a.delete("/admin/v1/tenants/delta")).json() == {"id": "delta", "deleted": True}
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 401
        assert (await a.get("/admin/v1/tenants/delta")).status_code == 404
        assert [t["id"] for t in (await a.get("/admin/v1/tenants")).json()["data"]] == ["alpha", "beta", "gamma"]


async def test_bodies_are_validated_like_the_tenants_file_and_errors_name_the_field(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, admin(g.url) as a:
        cases = [
            ("post", "/admin/v1/tenants", {"id": "x", "tier": "batch", "rpm": 0}, "rpm"),
            ("post", "/admin/v1/tenants", {"id": "x", "tier": "gold"}, "tier"),
            ("post", "/admin/v1/tenants", {"id": "bad id!", "tier": "batch"}, "id"),
            ("post", "/admin/v1/tenants", {"id": "x", "tier": "batch", "colour": "red"}, "colour"),
            ("post", "/admin/v1/tenants", {"id": "x", "tier": "batch", "keys": []}, "keys"),
            ("patch", "/admin/v1/tenants/alpha", {"budget_usd": -1}, "budget_usd"),
            ("patch", "/admin/v1/tenants/alpha", {"id": "other"}, "id"),
        ]
        for method, path, body, field in cases:
            r = await a.request(method, path, json=body)
            assert r.status_code == 400, (body, r.text)
            error = r.json()["error"]
            assert error["param"] == field, error
            assert error["message"].split(": ")[1] == field, error
        assert (await a.patch("/admin/v1/tenants/nobody", json={"rpm": 1})).status_code == 404
        assert (await a.get("/admin/v1/tenants/alpha")).json()["changed_at_runtime"] is False
        assert (await a.get("/admin/v1/audit")).json()["data"] == []  # refused changes leave no trace


async def test_a_suspended_tenant_gets_403_and_resumes(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, admin(g.url) as a:
        assert (await a.patch("/admin/v1/tenants/alpha", json={"suspended": True})).json()["suspended"] is True
        status, body = await chat_status(g.url, "alpha")
        assert status == 403
        assert body["error"]["code"] == "tenant_suspended"
        assert body["error"]["type"] == "permission_error"
        assert "'alpha' is suspended" in body["error"]["message"]
        assert (await chat_status(g.url, "beta"))[0] == 200
        await a.patch("/admin/v1/tenants/alpha", json={"suspended": False})
        assert (await chat_status(g.url, "alpha"))[0] == 200
        view = (await a.get("/admin/v1/tenants/alpha")).json()
        assert view["source"] == "tenants-file"
        assert view["changed_at_runtime"] is True
        assert w.bodies
        assert len(w.bodies) == 2


async def test_a_budget_is_raised_and_reset_without_a_restart(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    tenants = make_tenants(alpha={"budget_usd": 5.0})
    async with serve_gateway(make_fleet([w.url]), tenants) as g, admin(g.url) as a:
        await g.store.settle(windows=(), slots=(), spend={spend_key("alpha"): 5.0}, now=g.gw.clock.wall())
        status, body = await chat_status(g.url, "alpha")
        assert (status, body["error"]["type"]) == (429, "insufficient_quota")
        await a.patch("/admin/v1/tenants/alpha", json={"budget_usd": 6.0})
        assert (await chat_status(g.url, "alpha"))[0] == 200
        await a.patch("/admin/v1/tenants/alpha", json={"budget_usd": 5.0})
        assert (await chat_status(g.url, "alpha"))[0] == 429
        reset = (await a.post("/admin/v1/tenants/alpha/budget/reset")).json()
        assert reset["spent_before_usd"] >= 5.0
        assert reset["budget_usd"] == 5.0
        assert await g.store.spent(spend_key("alpha")) < 5.0
        assert (await chat_status(g.url, "alpha"))[0] == 200


async def test_every_admin_change_is_audited_with_the_admin_key_id(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    named = {"alice": "alice-admin-key", "bob": "bob-admin-key"}
    async with serve_gateway(make_fleet([w.url]), make_tenants(), admin_keys=named) as g:
        async with admin(g.url, named["alice"]) as alice, admin(g.url, named["bob"]) as bob, admin(g.url) as root:
            assert (await alice.post("/admin/v1/tenants", json={"id": "delta", "tier": "batch"})).status_code == 201
            assert (await bob.patch("/admin/v1/tenants/delta", json={"tpm": 1000})).status_code == 200
            key_id = (await root.post("/admin/v1/keys", json={"tenant": "delta"})).json()["key_id"]
            assert (await bob.delete(f"/admin/v1/keys/{key_id}")).status_code == 200
            assert (await alice.post("/admin/v1/tenants/delta/budget/reset")).status_code == 200
            assert (await root.put("/admin/v1/brownout", json={"mode": "on"})).status_code == 200
            assert (await alice.delete("/admin/v1/tenants/delta")).status_code == 200
            async with admin(g.url, "not-a-key") as stranger:
                assert (await stranger.patch("/admin/v1/tenants/alpha", json={"rpm": 1})).status_code == 401
            trail = (await bob.get("/admin/v1/audit")).json()["data"]
        assert [(e["who"], e["action"], e["target"]) for e in trail] == [
            ("alice", "tenant.create", "delta"),
            ("bob", "tenant.update", "delta"),
            ("admin", "key.create", key_id),
            ("bob", "key.revoke", key_id),
            ("alice", "tenant.budget_reset", "delta"),
            ("admin", "brownout.set", "brownout"),
            ("alice", "tenant.delete", "delta"),
        ]
        assert trail[1]["details"] == {"changes": {"tpm": 1000}}
        assert [e["at"] for e in trail] == sorted(e["at"] for e in trail)
        since = trail[3]["at"]
        async with admin(g.url) as root:
            later = (await root.get("/admin/v1/audit", params={"since": since})).json()["data"]
        assert next(e["action"] for e in later) == "key.revoke"


async def test_precedence_across_a_restart_run_time_wins_until_the_file_entry_changes(
    upstreams: StartUpstreams,
) -> None:
    """A run-time change survives a restart with the same file; the file wins once that tenant's entry in it
    changed, and another tenant's change in the file leaves the run-time change in force."""
    (w,) = await upstreams(1)
    store = MemoryStore()
    fleet, file = make_fleet([w.url]), make_tenants(alpha={"rpm": 100}, beta={"rpm": 100})
    async with serve_gateway(fleet, file, store=store) as g, admin(g.url) as a:
        await a.patch("/admin/v1/tenants/alpha", json={"rpm": 7})
        await a.patch("/admin/v1/tenants/beta", json={"rpm": 8})
    async with serve_gateway(fleet, file, store=store) as g, admin(g.url) as a:
        views = {t["id"]: t for t in (await a.get("/admin/v1/tenants")).json()["data"]}
        assert (views["alpha"]["rpm"], views["alpha"]["changed_at_runtime"]) == (7, True)
        assert g.gw.tenants.tenant("alpha") == file.tenant("alpha").model_copy(update={"rpm": 7})  # type: ignore[union-attr]
    edited = make_tenants(alpha={"rpm": 50}, beta={"rpm": 100})
    async with serve_gateway(fleet, edited, store=store) as g, admin(g.url) as a:
        views = {t["id"]: t for t in (await a.get("/admin/v1/tenants")).json()["data"]}
        assert (views["alpha"]["rpm"], views["alpha"]["superseded"], views["alpha"]["changed_at_runtime"]) == (
            50,
            True,
            False,
        )
        assert (views["beta"]["rpm"], views["beta"]["changed_at_runtime"]) == (8, True)


async def test_the_openapi_document_describes_the_tenant_routes(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, httpx.AsyncClient(base_url=g.url) as c:
        doc = (await c.get("/openapi.json")).json()
    paths = doc["paths"]
    assert set(paths["/admin/v1/tenants"]) == {"get", "post"}
    assert set(paths["/admin/v1/tenants/{tenant_id}"]) == {"get", "patch", "delete"}
    assert "post" in paths["/admin/v1/tenants/{tenant_id}/budget/reset"]
    assert "get" in paths["/admin/v1/audit"]
    create = paths["/admin/v1/tenants"]["post"]
    body = create["requestBody"]["content"]["application/json"]["schema"]
    settable = set(TenantConfig.model_fields) - {"keys"}
    assert set(body["properties"]) == settable
    assert body["required"] == ["id", "tier"]
    assert body["properties"]["rpm"]["anyOf"][0]["exclusiveMinimum"] == 0
    patch = paths["/admin/v1/tenants/{tenant_id}"]["patch"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(patch["properties"]) == settable - {"id"} | {"version"}, "a PATCH may name the version it edits"
    assert {"409", "412"} <= set(paths["/admin/v1/tenants/{tenant_id}"]["patch"]["responses"])
    assert patch["required"] == []
    assert {"409", "403", "400"} <= set(create["responses"])
    assert create["security"] == [{"adminKey": []}]
    assert settable - {"id"} < set(TenantView.model_fields), "a tenant field the admin API does not show"
