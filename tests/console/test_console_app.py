"""The console on a real gateway (loopback, memory store), driven over HTTP like a browser without scripts:
sign-in and its cookie, the failed-login limit, CSRF on every form, each action landing through the admin API
(the same views, validation and audit trail), the pages, and the console off when switched off."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from fleet.worker_mode import Mode, Phase, WorkerMode, write_mode
from tests.gateway.harness import (
    ADMIN_KEY,
    MODEL,
    RunningGateway,
    StartUpstreams,
    eventually,
    make_fleet,
    make_tenants,
    serve_gateway,
)

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@asynccontextmanager
async def console_gateway(upstreams: StartUpstreams, **settings: Any) -> AsyncIterator[RunningGateway]:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants(), **settings) as g:
        yield g


@asynccontextmanager
async def logged_in(g: RunningGateway) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A browser-like client with a session, and the CSRF token of its pages."""
    async with httpx.AsyncClient(base_url=g.url, timeout=10.0) as client:
        r = await client.post("/console/login", data={"admin_key": ADMIN_KEY})
        assert r.status_code == 303, r.text
        page = await client.get("/console/tenants")
        assert page.status_code == 200
        match = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert match is not None
        yield client, match.group(1)


async def test_the_admin_key_opens_a_short_httponly_strict_session(upstreams: StartUpstreams) -> None:
    async with console_gateway(upstreams) as g, httpx.AsyncClient(base_url=g.url) as c:
        r = await c.get("/console/fleet")
        assert r.status_code == 303
        assert r.headers["location"].endswith("/console/login")
        r = await c.post("/console/login", data={"admin_key": ADMIN_KEY})
        assert r.status_code == 303
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie
        assert "samesite=strict" in cookie
        assert "path=/console" in cookie
        max_age = re.search(r"max-age=(\d+)", cookie)
        assert max_age is not None
        assert 0 < int(max_age[1]) <= 3600
        assert (await c.get("/console/fleet")).status_code == 200
        # the session is not an admin API credential, and an admin API key is not a session
        assert (await c.get("/admin/v1/tenants")).status_code == 401
        async with httpx.AsyncClient(base_url=g.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as api:
            assert (await api.get("/console/fleet")).status_code == 303


async def test_failed_logins_are_rate_limited(upstreams: StartUpstreams) -> None:
    async with console_gateway(upstreams, console_login_failures=3) as g, httpx.AsyncClient(base_url=g.url) as c:
        statuses = [(await c.post("/console/login", data={"admin_key": "guess"})).status_code for _ in range(4)]
        assert statuses == [401, 401, 401, 429]
        r = await c.post("/console/login", data={"admin_key": ADMIN_KEY})
        assert r.status_code == 429  # even the right key waits
        assert int(r.headers["retry-after"]) > 0


async def test_every_form_needs_the_sessions_csrf_token(upstreams: StartUpstreams) -> None:
    async with console_gateway(upstreams) as g, logged_in(g) as (client, csrf):
        forms = [
            ("/console/tenants", {"id": "x", "tier": "batch"}),
            ("/console/tenants/alpha", {"rpm": "5"}),
            ("/console/tenants/alpha/suspend", {}),
            ("/console/tenants/alpha/resume", {}),
            ("/console/tenants/alpha/keys", {}),
            ("/console/tenants/alpha/keys/k/revoke", {}),
            ("/console/tiers/batch", {"priority": "3"}),
            ("/console/logout", {}),
        ]
        for path, data in forms:
            for token in (None, "forged", csrf[:-1]):
                body = data if token is None else {**data, "csrf": token}
                r = await client.post(path, data=body)
                assert r.status_code == 403, (path, token, r.status_code)
        async with g.admin() as api:
            assert (await api.get("/admin/v1/audit")).json()["data"] == []  # nothing changed


async def test_console_actions_go_through_the_admin_api(upstreams: StartUpstreams) -> None:
    async with console_gateway(upstreams) as g, g.admin() as api, logged_in(g) as (client, csrf):
        r = await client.post(
            "/console/tenants", data={"csrf": csrf, "id": "delta", "tier": "batch", "rpm": "", "budget_usd": "2"}
        )
        assert r.status_code == 303
        assert "created" in (await client.get(r.headers["location"])).text
        view = (await api.get("/admin/v1/tenants/delta")).json()
        assert (view["tier"], view["rpm"], view["budget_usd"], view["changed_by"]) == ("batch", None, 2.0, "admin")
        # a bad value is refused by the admin API's validation, naming the field
        r = await client.post("/console/tenants/delta", data={"csrf": csrf, "rpm": "0"}, follow_redirects=True)
        assert "rpm" in r.text
        assert (await api.get("/admin/v1/tenants/delta")).json()["rpm"] is None
        # a key, shown once
        r = await client.post("/console/tenants/delta/keys", data={"csrf": csrf, "key_id": "delta-k"})
        assert r.status_code == 201
        secret = re.search(r'id="new-secret">([^<]+)<', r.text)
        assert secret is not None
        assert "gs-" in secret.group(1)
        assert secret.group(1) not in (await client.get("/console/tenants/delta")).text
        async with httpx.AsyncClient(base_url=g.url, headers={"authorization": f"Bearer {secret.group(1)}"}) as t:
            assert (await t.post("/v1/chat/completions", json=CHAT)).status_code == 200
            await client.post("/console/tenants/delta/suspend", data={"csrf": csrf})
            assert (await t.post("/v1/chat/completions", json=CHAT)).status_code == 403
            await client.post("/console/tenants/delta/resume", data={"csrf": csrf})
            assert (await t.post("/v1/chat/completions", json=CHAT)).status_code == 200
            await client.post("/console/tenants/delta/keys/delta-k/revoke", data={"csrf": csrf})
            assert (await t.post("/v1/chat/completions", json=CHAT)).status_code == 401
        # a tier
        form = {"csrf": csrf, "priority": "3", "speculation": "off", "prefer": "neutral"}
        r = await client.post("/console/tiers/batch", data=form)
        assert r.status_code == 303
        tier = next(t for t in (await api.get("/admin/v1/tiers")).json()["data"] if t["name"] == "batch")
        assert (tier["config"]["priority"], tier["config"]["sheddable"], tier["changed_by"]) == (3, False, "admin")
        assert (tier["config"]["speculation"], tier["config"]["prefer"]) == ("off", "neutral")
        r = await client.post("/console/tiers/batch", data={"csrf": csrf, "ttft_target_s": "-2"}, follow_redirects=True)
        assert "ttft_target_s" in r.text
        actions = [e["action"] for e in (await api.get("/admin/v1/audit")).json()["data"]]
        assert actions == [
            "tenant.create", "key.create", "tenant.update", "tenant.update", "key.revoke", "tier.update",
        ]  # fmt: skip
        pages = [
            "/console/fleet", "/console/fleet/table", "/console/tenants", "/console/tenants/delta",
            "/console/tiers", "/console/costs", "/console/static/htmx-2.0.11.min.js",
        ]  # fmt: skip
        for page in pages:
            r = await client.get(page)
            assert r.status_code == 200, (page, r.text[:500])
        assert "delta" in (await client.get("/console/costs")).text
        await client.post("/console/logout", data={"csrf": csrf})
        assert (await client.get("/console/fleet")).status_code == 303


@pytest.mark.parametrize(
    "settings", [{"console_enabled": False}, {"admin_key": ""}], ids=["switched off", "no admin key"]
)
async def test_the_console_is_off_unless_enabled_with_the_admin_api(
    upstreams: StartUpstreams, settings: dict[str, Any]
) -> None:
    async with console_gateway(upstreams, **settings) as g, httpx.AsyncClient(base_url=g.url) as c:
        assert (await c.get("/console/login")).status_code == 404
        assert (await c.post("/console/login", data={"admin_key": ADMIN_KEY})).status_code == 404
        assert (await c.get("/console/static/htmx-2.0.11.min.js")).status_code == 404
        assert (await c.get("/healthz")).status_code == 200


async def test_the_fleet_page_shows_a_draining_worker_and_an_unknown_tenant_is_a_404_page(
    upstreams: StartUpstreams,
) -> None:
    async with console_gateway(upstreams) as g, logged_in(g) as (client, _):
        now = g.gw.clock.wall()
        await write_mode(
            g.store, WorkerMode(worker_id="w0", mode=Mode.DRAFTER, phase=Phase.DRAINING, since=now, mode_since=now)
        )
        await eventually(lambda: _shows(client, "/console/fleet/table", "draining"))
        r = await client.get("/console/tenants/nobody")
        assert r.status_code == 404
        assert r.headers["content-type"].startswith("text/html")
        assert "No tenant &#39;nobody&#39;" in r.text


async def _shows(client: httpx.AsyncClient, page: str, text: str) -> bool:
    return text in (await client.get(page)).text
