"""Store contract, shared records: worker state, ejections, leases, the usage ledger and API keys."""

from __future__ import annotations

import pytest

from fleet.store.protocol import ApiKeyRecord, UsageRecord, WorkerState
from tests.fleet.store_harness import T0, StoreHarness


def state(worker_id: str, *, k: int = 4) -> WorkerState:
    return WorkerState(
        worker_id=worker_id,
        model="kimi-k3",
        k_desired=k,
        k_applied=k,
        accepted_length=3.25,
        acceptance_per_pos=[0.9, 0.7, 0.5],
        usd_per_mtok=1.5,
        updated_at=T0,
    )


def record(i: int, *, tenant: str = "acme", at: float | None = None) -> UsageRecord:
    return UsageRecord(
        request_id=f"req-{tenant}-{i}",
        tenant=tenant,
        model="kimi-k3",
        worker_id="sim-0",
        prompt_tokens=100 + i,
        completion_tokens=10 * i,
        cost_usd=0.001 * (i + 1) + 0.1,
        status="ok",
        ttft_s=0.25,
        at=T0 + i if at is None else at,
    )


async def test_worker_states_round_trip_and_expire(harness: StoreHarness) -> None:
    store = harness.store
    await store.publish_worker_state(state("w0"), ttl_s=0.2)
    await store.publish_worker_state(state("w1"), ttl_s=60)
    assert await store.worker_states() == {"w0": state("w0"), "w1": state("w1")}
    await store.publish_worker_state(state("w1", k=2), ttl_s=60)  # the newest state replaces the old
    await harness.elapse(0.3)
    assert await store.worker_states() == {"w1": state("w1", k=2)}


async def test_ejections_hold_until_their_time(harness: StoreHarness) -> None:
    store = harness.store
    await store.eject("w0", until=T0 + 10, reason="5 consecutive errors")
    await store.eject("w1", until=T0 + 1, reason="timeouts")
    assert await store.ejected(now=T0) == {"w0": T0 + 10, "w1": T0 + 1}
    assert await store.ejected(now=T0 + 1) == {"w0": T0 + 10}
    await store.eject("w0", until=T0 + 20, reason="again")
    assert await store.ejected(now=T0 + 15) == {"w0": T0 + 20}
    assert await store.ejected(now=T0 + 20) == {}


async def test_lease_is_exclusive_renewable_and_taken_over_after_expiry(harness: StoreHarness) -> None:
    store = harness.store
    assert await store.lease_holder("ctl") is None
    assert await store.acquire_lease("ctl", "a", ttl_s=0.3)
    assert not await store.acquire_lease("ctl", "b", ttl_s=0.3)
    assert await store.acquire_lease("ctl", "a", ttl_s=0.3)  # renewal
    await store.release_lease("ctl", "b")  # not the holder: no effect
    assert await store.lease_holder("ctl") == "a"
    await harness.elapse(0.4)
    assert await store.lease_holder("ctl") is None
    assert await store.acquire_lease("ctl", "b", ttl_s=30)
    assert not await store.acquire_lease("ctl", "a", ttl_s=30)
    await store.release_lease("ctl", "a")
    assert await store.lease_holder("ctl") == "b"
    await store.release_lease("ctl", "b")
    assert await store.lease_holder("ctl") is None
    assert await store.acquire_lease("ctl", "a", ttl_s=30)


async def test_renewal_extends_the_lease(harness: StoreHarness) -> None:
    store = harness.store
    assert await store.acquire_lease("ctl", "a", ttl_s=0.3)
    await harness.elapse(0.2)
    assert await store.acquire_lease("ctl", "a", ttl_s=0.3)
    await harness.elapse(0.2)  # 0.4 s after the first grant, 0.2 s after the renewal
    assert await store.lease_holder("ctl") == "a"


async def test_replicas_count_themselves_until_their_heartbeat_lapses(harness: StoreHarness) -> None:
    store = harness.store
    assert await store.replica_heartbeat("gw-a", ttl_s=10, now=T0) == 1
    assert await store.replica_heartbeat("gw-b", ttl_s=10, now=T0 + 1) == 2
    assert await store.replica_heartbeat("gw-a", ttl_s=10, now=T0 + 5) == 2  # a renewal is not a new replica
    assert await store.replica_heartbeat("gw-a", ttl_s=10, now=T0 + 12) == 1  # gw-b lapsed at T0 + 11


async def test_ledger_totals_equal_the_appended_records(harness: StoreHarness) -> None:
    store = harness.store
    appended = [record(i) for i in range(30)] + [record(i, tenant="other") for i in range(5)]
    for r in reversed(appended):  # arrival order differs from time order
        await store.append_usage(r)
    usage = await store.usage("acme", since=T0 + 5, until=T0 + 25)
    chosen = [r for r in appended if r.tenant == "acme" and T0 + 5 <= r.at < T0 + 25]
    assert usage.requests == len(chosen) == 20
    assert usage.prompt_tokens == sum(r.prompt_tokens for r in chosen)
    assert usage.completion_tokens == sum(r.completion_tokens for r in chosen)
    assert usage.cost_usd == pytest.approx(sum(r.cost_usd for r in chosen), rel=1e-12)
    assert list(usage.records) == chosen  # in time order
    everything = await store.usage("acme", since=0, until=float("inf"))
    assert everything.requests == 30


async def test_ledger_caps_records_not_totals(harness: StoreHarness) -> None:
    store = harness.store
    for i in range(10):
        await store.append_usage(record(i))
    usage = await store.usage("acme", since=T0, until=T0 + 100, limit=3)
    assert usage.requests == 10
    assert usage.completion_tokens == sum(10 * i for i in range(10))
    assert [r.request_id for r in usage.records] == ["req-acme-0", "req-acme-1", "req-acme-2"]
    assert (await store.usage("nobody", since=0, until=float("inf"))).requests == 0


async def test_a_batch_appends_like_single_appends(harness: StoreHarness) -> None:
    store = harness.store
    batch = [record(i) for i in range(12)] + [record(i, tenant="other") for i in range(3)] + [record(2)]
    await store.append_usage_many(batch)
    await store.append_usage_many([])
    await store.append_usage_many([record(3), record(12)])  # one already there, one new
    usage = await store.usage("acme", since=0, until=float("inf"))
    assert [r.request_id for r in usage.records] == [f"req-acme-{i}" for i in range(13)]
    assert usage.completion_tokens == sum(r.completion_tokens for r in usage.records)
    assert (await store.usage("other", since=0, until=float("inf"))).requests == 3


async def test_appending_the_same_record_twice_bills_once(harness: StoreHarness) -> None:
    store = harness.store
    await store.append_usage(record(1))
    await store.append_usage(record(1))
    await store.append_usage(record(1).model_copy(update={"request_id": "retry-of-1"}))
    assert (await store.usage("acme", since=0, until=float("inf"))).requests == 2


async def test_the_ledger_dedupes_by_request_id(harness: StoreHarness) -> None:
    """A replayed record counts once even when it was rebuilt (another time, cost or status)."""
    store = harness.store
    await store.append_usage_many([record(1), record(2)])
    await store.append_usage_many([record(1).model_copy(update={"at": T0 + 50, "cost_usd": 9.0}), record(3)])
    usage = await store.usage("acme", since=0, until=float("inf"))
    assert [r.request_id for r in usage.records] == ["req-acme-1", "req-acme-2", "req-acme-3"]
    assert usage.cost_usd == pytest.approx(sum(record(i).cost_usd for i in (1, 2, 3)), rel=1e-12)


async def test_the_fleet_wide_ledger_merges_tenants_by_time(harness: StoreHarness) -> None:
    store = harness.store
    appended = [
        record(i, tenant=tenant, at=T0 + i + offset) for i in range(6) for tenant, offset in (("a", 0.0), ("b", 0.5))
    ]
    await store.append_usage_many(appended[::-1])
    ledger = await store.ledger(since=T0 + 1, until=T0 + 5)
    assert [(r.tenant, r.at) for r in ledger] == [(r.tenant, r.at) for r in appended if T0 + 1 <= r.at < T0 + 5]
    assert [r.at for r in await store.ledger(since=0, until=float("inf"), limit=3)] == [T0, T0 + 0.5, T0 + 1]
    assert await store.ledger(since=0, until=float("inf"), limit=0) == []


async def test_api_keys_by_digest_list_and_revoke(harness: StoreHarness) -> None:
    store = harness.store
    keys = [
        ApiKeyRecord(key_id="k2", tenant="acme", digest="hmac-sha256:" + "b" * 64, created_at=T0 + 2),
        ApiKeyRecord(key_id="k1", tenant="acme", digest="hmac-sha256:" + "a" * 64, created_at=T0 + 1),
        ApiKeyRecord(key_id="k3", tenant="other", digest="hmac-sha256:" + "c" * 64, created_at=T0 + 3),
    ]
    for k in keys:
        await store.put_api_key(k)
    assert await store.api_key_by_digest(keys[0].digest) == keys[0]
    assert await store.api_key_by_digest("hmac-sha256:" + "0" * 64) is None
    assert [k.key_id for k in await store.api_keys()] == ["k1", "k2", "k3"]
    assert [k.key_id for k in await store.api_keys("acme")] == ["k1", "k2"]
    assert await store.revoke_api_key("k2")
    assert not await store.revoke_api_key("missing")
    revoked = await store.api_key_by_digest(keys[0].digest)
    assert revoked is not None
    assert revoked.revoked
    assert [k.revoked for k in await store.api_keys("acme")] == [False, True]


async def test_ping(harness: StoreHarness) -> None:
    assert await harness.store.ping()
