"""The step from schema version 1 (``fleet.store.keys.SCHEMA_VERSION``): a prefix a version-1 gearshift wrote is
upgraded at ``verify`` and read as it is, with no data moved: its run-time tenant changes (documents without
``version`` or ``budget_period``) and its admin audit entries at the log's old key (``{log:admin-audit}``)."""

from __future__ import annotations

import uuid

import orjson
import pytest

from fleet.config import TenantConfig
from fleet.store.keys import SCHEMA_VERSION, KeyLayout
from fleet.tenants import COLLECTION, TenantChange, parse_changes
from gateway.usage import audit
from tests.fleet.conftest import redis_store

VERSION_1 = 1


def version_1_document(change: TenantChange) -> str:
    """``change`` as a version-1 gearshift stored it: without the fields version 2 added."""
    body = change.model_dump(mode="json")
    del body["version"]
    assert body["tenant"] is not None
    del body["tenant"]["budget_period"]
    return orjson.dumps(body).decode()


async def test_a_version_1_prefix_is_upgraded_and_read_as_it_is(
    request: pytest.FixtureRequest, redis_kind: str, key_prefix: str
) -> None:
    store = await redis_store(request, redis_kind, key_prefix)
    keys, raw = KeyLayout(key_prefix), store._redis
    tenant = TenantConfig(id="acme", tier="interactive", rpm=5, suspended=True)
    change = TenantChange(tenant_id="acme", tenant=tenant, file_digest=None, changed_at=1.0, changed_by="admin-1")
    entry = audit.entry(who="admin-1", action="tenant.update", target="acme", now=1.0)
    legacy = keys.legacy_log(audit.LOG)
    assert legacy is not None
    try:
        await raw.set(keys.schema(), str(VERSION_1))
        await raw.set(keys.doc_prefix(COLLECTION) + "acme", version_1_document(change))
        await raw.sadd(keys.doc_ids(COLLECTION), "acme")
        await raw.zadd(legacy, {f"{uuid.uuid4().hex}:{entry}": 1.0})

        await store.verify()

        assert await raw.get(keys.schema()) == str(SCHEMA_VERSION)
        read = parse_changes(await store.docs(COLLECTION))
        assert read["acme"].tenant == tenant
        assert read["acme"].version == 0
        (found,) = await audit.read(store, since=0.0, until=2.0, limit=10)
        assert (found.action, found.target, found.who) == ("tenant.update", "acme", "admin-1")
    finally:
        await raw.delete(keys.schema(), keys.doc_prefix(COLLECTION) + "acme", keys.doc_ids(COLLECTION), legacy)
        await store.close()
