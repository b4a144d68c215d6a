"""A run-time tenant (or tier) change and its audit entry are one write (issue 23, defect 12): a store that fails
after the first write it takes leaves both or neither, on the memory store and on a real Redis; and the Redis
write itself is all or nothing (``Store.put_doc_logged``, one script that checks before it writes)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest
from redis.asyncio import Redis

from fleet.store.keys import KeyLayout, ScopeMismatch
from fleet.store.memory import MemoryStore
from fleet.store.protocol import Store
from fleet.store.redis import RedisStore
from fleet.tenants import COLLECTION
from gateway.usage import audit

from .harness import StartUpstreams, make_fleet, make_tenants, serve_gateway

STORES = ["memory", pytest.param("redis", marks=pytest.mark.redis)]


class FailsAfterOneWrite:
    """A store that takes one write to the tenants collection or the audit trail once ``armed``, and fails every
    later one (a connection lost, a process killed, between two writes); everything else goes to ``inner``."""

    WRITES = ("put_doc", "delete_doc", "append_log", "put_doc_logged")

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.armed = False
        self.writes = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)
        if name not in self.WRITES:
            return method

        async def write(*args: Any, **kwargs: Any) -> Any:
            if self.armed:
                self.writes += 1
                if self.writes > 1:
                    raise ConnectionError("the store went away after the first write")
            return await method(*args, **kwargs)

        return write


@pytest.fixture(params=STORES)
async def inner_store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
        return
    store = RedisStore.from_url(request.getfixturevalue("redis_url"), prefix=f"gs-tw-{uuid.uuid4().hex[:8]}:")
    yield store
    await store.close()


async def _audited(store: Store, target: str) -> list[audit.AuditEntry]:
    return [e for e in await audit.read(store, since=0.0, until=4e9, limit=1000) if e.target == target]


ACTIONS: dict[str, tuple[str, str, dict[str, Any] | None]] = {
    "create": ("POST", "/admin/v1/tenants", {"id": "delta", "tier": "batch"}),
    "update": ("PATCH", "/admin/v1/tenants/alpha", {"rpm": 7}),
    "delete": ("DELETE", "/admin/v1/tenants/beta", None),
    "tier": ("PATCH", "/admin/v1/tiers/batch", {"priority": 3}),
}
TARGETS = {"create": "delta", "update": "alpha", "delete": "beta", "tier": "batch"}
DOC_IDS: dict[str, Callable[[str], str]] = {"tier": lambda t: f"tier:{t}"}


@pytest.mark.parametrize("action", sorted(ACTIONS))
async def test_a_change_and_its_audit_entry_are_both_stored_or_neither(
    action: str, inner_store: Store, upstreams: StartUpstreams
) -> None:
    (w,) = await upstreams(1)
    store = FailsAfterOneWrite(inner_store)
    method, path, body = ACTIONS[action]
    target = TARGETS[action]
    doc_id = DOC_IDS.get(action, lambda t: t)(target)
    async with serve_gateway(make_fleet([w.url]), make_tenants(), store=cast(Store, store)) as g, g.admin() as a:
        store.armed = True
        await a.request(method, path, json=body)
        store.armed = False
    changed = doc_id in await inner_store.docs(COLLECTION)
    entries = await _audited(inner_store, target)
    assert changed == bool(entries), f"change stored: {changed}, audit entries: {entries}"
    assert changed, "the first write is the whole change: it is stored, with its entry"


@pytest.mark.redis
async def test_on_redis_a_failing_write_leaves_neither_the_document_nor_the_entry(redis_url: str) -> None:
    prefix = f"gs-tw-{uuid.uuid4().hex[:8]}:"
    store = RedisStore.from_url(redis_url, prefix=prefix)
    raw = Redis.from_url(redis_url, decode_responses=True)
    keys = KeyLayout(prefix)
    try:
        await store.put_doc_logged(COLLECTION, "acme", '{"v": 1}', log=audit.LOG, entry='{"n": 1}', now=100.0)
        assert await store.docs(COLLECTION) == {"acme": '{"v": 1}'}
        assert [e.body for e in await store.read_log(audit.LOG, since=0, until=1e9)] == ['{"n": 1}']
        await raw.delete(keys.log(audit.LOG))
        await raw.set(keys.log(audit.LOG), "not a log")  # the second write (the entry) now fails
        with pytest.raises(Exception, match="WRONGTYPE"):
            await store.put_doc_logged(COLLECTION, "acme", '{"v": 2}', log=audit.LOG, entry='{"n": 2}', now=101.0)
        assert await store.docs(COLLECTION) == {"acme": '{"v": 1}'}, "the document changed without its entry"
        with pytest.raises(Exception, match="WRONGTYPE"):
            await store.put_doc_logged(COLLECTION, "acme", None, log=audit.LOG, entry='{"n": 3}', now=102.0)
        assert await store.docs(COLLECTION) == {"acme": '{"v": 1}'}, "the document was deleted without its entry"
    finally:
        await raw.aclose()
        await store.close()


async def test_a_log_is_written_only_with_the_collection_it_lives_with() -> None:
    store = MemoryStore()
    with pytest.raises(ScopeMismatch):
        await store.put_doc_logged("plans", "m", "{}", log=audit.LOG, entry="{}", now=1.0)
    assert await store.docs("plans") == {}
    assert await store.read_log(audit.LOG, since=0, until=9) == []


@pytest.mark.redis
async def test_audit_entries_written_before_the_log_moved_to_the_tenants_slot_are_still_read(redis_url: str) -> None:
    prefix = f"gs-tw-{uuid.uuid4().hex[:8]}:"
    store = RedisStore.from_url(redis_url, prefix=prefix)
    raw = Redis.from_url(redis_url, decode_responses=True)
    try:
        legacy = KeyLayout(prefix).legacy_log(audit.LOG)
        assert legacy is not None
        await raw.zadd(legacy, {"0123:" + audit.entry(who="admin", action="key.create", target="k", now=5.0): 5.0})
        await audit.record(store, who="admin", action="brownout.set", target="brownout", now=6.0)
        entries = await audit.read(store, since=0.0, until=10.0, limit=10)
        assert [(e.at, e.action) for e in entries] == [(5.0, "key.create"), (6.0, "brownout.set")]
        assert len(await audit.read(store, since=0.0, until=10.0, limit=1)) == 1
    finally:
        await raw.aclose()
        await store.close()
