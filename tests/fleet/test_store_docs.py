"""Store contract, shared documents and append-only logs (plans, run-time tenants, worker modes, the audit)."""

from __future__ import annotations

from tests.fleet.store_harness import T0, StoreHarness


async def test_documents_round_trip_replace_delete_and_expire(harness: StoreHarness) -> None:
    store = harness.store
    await store.put_doc("plans", "kimi-k3", '{"v": 1}')
    await store.put_doc("plans", "other", '{"v": 9}', ttl_s=0.2)
    await store.put_doc("tenants", "acme", '{"tier": "batch"}')
    assert await store.docs("plans") == {"kimi-k3": '{"v": 1}', "other": '{"v": 9}'}
    await store.put_doc("plans", "kimi-k3", '{"v": 2}')  # the newest body replaces the old
    assert await store.get_doc("plans", "kimi-k3") == '{"v": 2}'
    await harness.elapse(0.3)
    assert await store.docs("plans") == {"kimi-k3": '{"v": 2}'}
    assert await store.get_doc("plans", "other") is None
    assert await store.delete_doc("plans", "kimi-k3") is True
    assert await store.delete_doc("plans", "kimi-k3") is False
    assert await store.docs("plans") == {}
    assert await store.docs("tenants") == {"acme": '{"tier": "batch"}'}, "collections are separate"


async def test_log_reads_a_time_range_oldest_first_and_keeps_equal_entries(harness: StoreHarness) -> None:
    store = harness.store
    await store.append_log("audit", '{"op": "b"}', now=T0 + 2)
    await store.append_log("audit", '{"op": "a"}', now=T0 + 1)
    await store.append_log("audit", '{"op": "a"}', now=T0 + 1)
    await store.append_log("audit", '{"op": "c:with:colons"}', now=T0 + 3)
    await store.append_log("other", '{"op": "x"}', now=T0 + 1)
    entries = await store.read_log("audit", since=T0, until=T0 + 3)
    assert [(e.at - T0, e.body) for e in entries] == [(1, '{"op": "a"}'), (1, '{"op": "a"}'), (2, '{"op": "b"}')]
    assert [e.body for e in await store.read_log("audit", since=T0 + 3, until=T0 + 4)] == ['{"op": "c:with:colons"}']
    assert len(await store.read_log("audit", since=T0, until=T0 + 9, limit=2)) == 2
    assert await store.read_log("audit", since=T0, until=T0 + 9, limit=0) == []


async def test_a_document_and_its_log_entry_are_written_together(harness: StoreHarness) -> None:
    """``put_doc_logged`` (issue 23: a tenant change and its audit entry are one write), also on a Redis Cluster:
    the log lives in the collection's slot."""
    store = harness.store
    await store.put_doc_logged("tenants", "acme", '{"v": 1}', log="admin-audit", entry='{"op": "create"}', now=T0 + 1)
    await store.put_doc_logged("tenants", "acme", None, log="admin-audit", entry='{"op": "delete"}', now=T0 + 2)
    await store.put_doc_logged("tenants", "beta", '{"v": 2}', log="admin-audit", entry='{"op": "create"}', now=T0 + 3)
    await store.append_log("admin-audit", '{"op": "key"}', now=T0 + 4)  # an entry without a document change
    assert await store.docs("tenants") == {"beta": '{"v": 2}'}
    entries = await store.read_log("admin-audit", since=T0, until=T0 + 9)
    assert [e.body for e in entries] == ['{"op": "create"}', '{"op": "delete"}', '{"op": "create"}', '{"op": "key"}']
