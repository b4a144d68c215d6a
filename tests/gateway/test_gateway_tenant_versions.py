"""Two admins editing one tenant (issue 23, defect 12: last writer won): a tenant carries a version, ``GET`` answers
it as the ``ETag``, and a change made against an older version is refused — 412 with ``If-Match``, 409 with the
body's ``version`` — on the memory store, across two replicas on a real Redis (the store checks the version in the
same step that writes), and from the console's edit form."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

from fleet.store.memory import MemoryStore
from fleet.store.protocol import Store
from fleet.store.redis import RedisStore
from tests.console.test_console_app import logged_in

from .harness import StartUpstreams, make_fleet, make_tenants, serve_gateway

STORES = ["memory", pytest.param("redis", marks=pytest.mark.redis)]


@pytest.fixture(params=STORES)
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Store, Store]]:
    """Two store clients on one shared state: the same ``MemoryStore`` twice, or two clients of one Redis prefix."""
    if request.param == "memory":
        store = MemoryStore()
        yield store, store
        return
    prefix = f"gs-tv-{uuid.uuid4().hex[:8]}:"
    a, b = (RedisStore.from_url(request.getfixturevalue("redis_url"), prefix=prefix) for _ in range(2))
    yield a, b
    await a.close()
    await b.close()


async def test_a_change_made_against_an_older_version_is_refused_and_names_both_versions(
    stores: tuple[Store, Store], upstreams: StartUpstreams
) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants(), store=stores[0]) as g, g.admin() as admin:
        first = await admin.get("/admin/v1/tenants/alpha")
        assert first.headers["etag"] == '"0"'
        assert first.json()["version"] == 0
        seen = first.headers["etag"]  # both editors read version 0
        a = await admin.patch("/admin/v1/tenants/alpha", json={"rpm": 5}, headers={"if-match": seen})
        assert a.status_code == 200, a.text
        assert a.headers["etag"] == '"1"'
        b = await admin.patch("/admin/v1/tenants/alpha", json={"tpm": 900}, headers={"if-match": seen})
        assert b.status_code == 412, b.text
        assert "version 1" in b.json()["error"]["message"]
        assert "version 0" in b.json()["error"]["message"]
        b = await admin.patch("/admin/v1/tenants/alpha", json={"tpm": 900, "version": 0})
        assert b.status_code == 409, b.text
        assert b.json()["error"]["code"] == "version_conflict"
        now = (await admin.get("/admin/v1/tenants/alpha")).json()
        assert (now["rpm"], now["tpm"], now["version"]) == (5, None, 1), "the refused change did not land"
        b = await admin.patch("/admin/v1/tenants/alpha", json={"tpm": 900}, headers={"if-match": '"1"'})
        assert b.status_code == 200
        now = (await admin.get("/admin/v1/tenants/alpha")).json()
        assert (now["rpm"], now["tpm"], now["version"]) == (5, 900, 2), "re-applied on the new version: both kept"
        gone = await admin.delete("/admin/v1/tenants/alpha", headers={"if-match": '"1"'})
        assert gone.status_code == 412
        assert (await admin.delete("/admin/v1/tenants/alpha", headers={"if-match": '"2"'})).status_code == 200


async def test_two_editors_of_one_version_on_two_replicas_exactly_one_wins(
    stores: tuple[Store, Store], upstreams: StartUpstreams
) -> None:
    (w,) = await upstreams(1)
    fleet, tenants = make_fleet([w.url]), make_tenants()
    async with (
        serve_gateway(fleet, tenants, store=stores[0]) as ga,
        serve_gateway(fleet, tenants, store=stores[1]) as gb,
        ga.admin() as on_a,
        gb.admin() as on_b,
    ):
        for round_ in range(3):
            tags = [(await c.get("/admin/v1/tenants/beta")).headers["etag"] for c in (on_a, on_b)]
            assert tags[0] == tags[1] == f'"{round_}"'
            answers = await asyncio.gather(
                on_a.patch("/admin/v1/tenants/beta", json={"rpm": 10 + round_}, headers={"if-match": tags[0]}),
                on_b.patch("/admin/v1/tenants/beta", json={"tpm": 1000 + round_}, headers={"if-match": tags[1]}),
            )
            assert sorted(r.status_code for r in answers) == [200, 412], [r.text for r in answers]
            await _until_both_read(on_a, on_b, f'"{round_ + 1}"')


async def _until_both_read(a: httpx.AsyncClient, b: httpx.AsyncClient, tag: str) -> None:
    for _ in range(200):
        tags = [(await c.get("/admin/v1/tenants/beta")).headers["etag"] for c in (a, b)]
        if tags == [tag, tag]:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the replicas never both read {tag}")


async def test_the_consoles_edit_form_sends_its_version_and_a_stale_save_is_refused(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with (
        serve_gateway(make_fleet([w.url]), make_tenants()) as g,
        g.admin() as api,
        logged_in(g) as (browser, csrf),
    ):
        page = (await browser.get("/console/tenants/alpha")).text
        match = re.search(r'name="version" value="(\d+)"', page)
        assert match is not None, "the edit form carries no version"
        rendered_at = match.group(1)
        assert (await api.patch("/admin/v1/tenants/alpha", json={"rpm": 7})).status_code == 200  # another admin
        form = {"csrf": csrf, "version": rendered_at, "rpm": "3"}
        r = await browser.post("/console/tenants/alpha", data=form, follow_redirects=True)
        assert "version 1" in r.text, "the console shows the conflict"
        assert (await api.get("/admin/v1/tenants/alpha")).json()["rpm"] == 7, "the other admin's change stands"
        r = await browser.post("/console/tenants/alpha", data={**form, "version": "1"}, follow_redirects=True)
        assert (await api.get("/admin/v1/tenants/alpha")).json()["rpm"] == 3


async def test_a_tier_change_made_against_an_older_version_is_refused(
    stores: tuple[Store, Store], upstreams: StartUpstreams
) -> None:
    (w,) = await upstreams(1)
    fleet, tenants = make_fleet([w.url]), make_tenants()
    async with (
        serve_gateway(fleet, tenants, store=stores[0]) as ga,
        serve_gateway(fleet, tenants, store=stores[1]) as gb,
        ga.admin() as on_a,
        gb.admin() as on_b,
    ):
        tiers = {t["name"]: t for t in (await on_a.get("/admin/v1/tiers")).json()["data"]}
        assert tiers["batch"]["version"] == 0
        answers = await asyncio.gather(
            on_a.patch("/admin/v1/tiers/batch", json={"priority": 3}, headers={"if-match": '"0"'}),
            on_b.patch("/admin/v1/tiers/batch", json={"priority": 4}, headers={"if-match": '"0"'}),
        )
        assert sorted(r.status_code for r in answers) == [200, 412], [r.text for r in answers]
        winner = next(r for r in answers if r.status_code == 200).json()
        assert winner["version"] == 1
        stale = await on_a.patch("/admin/v1/tiers/batch", json={"priority": 5, "version": 0})
        assert stale.status_code == 409
        assert "Tier 'batch' is at version 1" in stale.json()["error"]["message"]
        assert (await on_a.patch("/admin/v1/tiers/batch", json={"priority": 5, "version": 1})).status_code == 200


async def test_the_consoles_tier_form_sends_its_version(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, logged_in(g) as (browser, _):
        page = (await browser.get("/console/tiers")).text
    assert re.search(r'name="version" value="0"', page), "the tier form carries no version"
