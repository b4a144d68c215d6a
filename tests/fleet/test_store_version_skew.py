"""Mixed gateway releases on one real Redis (issue 27; policy in docs/operations/upgrades.md).

A release of gearshift is described to the store by its ``SCHEMA_VERSION`` (``fleet.store.keys``): two releases
one minor apart that share it read and write one layout, so they share a prefix; a release that raises it
upgrades the prefix, after which a client of the older schema is refused at start rather than misreading it.
Each client here is a separate ``RedisStore`` with its own connection pool; the one "of another release"
claims an adjacent schema version (the constant ``verify`` reads), so the handshake runs as it would between
two builds, without checking out an old commit at test time.
"""

from __future__ import annotations

import pytest

import fleet.store.redis as redis_module
from fleet.store.keys import SCHEMA_VERSION, KeyLayout, StoreMisconfigured
from fleet.store.protocol import UsageRecord
from fleet.store.redis import RedisStore

pytestmark = pytest.mark.redis


def _record(i: int, at: float) -> UsageRecord:
    return UsageRecord(
        request_id=f"skew-{i}", tenant="t", model="m", worker_id=None, prompt_tokens=10, completion_tokens=i,
        cost_usd=0.001 * i, status="ok", at=at,
    )  # fmt: skip


async def _client(redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch, version: int) -> RedisStore:
    """A verified store client of a release whose schema version is ``version``."""
    store = RedisStore.from_url(redis_url, prefix=prefix, server_clock=False)
    with monkeypatch.context() as patch:
        patch.setattr(redis_module, "SCHEMA_VERSION", version)
        try:
            await store.verify()
        except StoreMisconfigured:
            await store.close()
            raise
    return store


async def test_two_releases_of_one_schema_share_a_prefix(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = await _client(redis_url, key_prefix, monkeypatch, SCHEMA_VERSION)
    new = await _client(redis_url, key_prefix, monkeypatch, SCHEMA_VERSION)
    try:
        await old.append_usage_many([_record(i, 100.0 + i) for i in range(1, 4)])
        await new.append_usage(_record(4, 104.0))
        for reader in (old, new):
            totals = await reader.usage("t", since=0.0, until=1_000.0)
            assert totals.completion_tokens == 1 + 2 + 3 + 4
            assert totals.requests == 4
        await old.put_doc("plans", "p", "{}")
        assert await new.get_doc("plans", "p") == "{}"
        assert await old._redis.get(KeyLayout(key_prefix).schema()) == str(SCHEMA_VERSION)
    finally:
        await old._redis.delete(KeyLayout(key_prefix).schema())
        await old.close()
        await new.close()


async def test_a_release_raising_the_schema_locks_the_older_one_out_of_the_prefix(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = await _client(redis_url, key_prefix, monkeypatch, SCHEMA_VERSION)
    newer = await _client(redis_url, key_prefix, monkeypatch, SCHEMA_VERSION + 1)
    key = KeyLayout(key_prefix).schema()
    try:
        assert await old._redis.get(key) == str(SCHEMA_VERSION + 1), "the newer release upgraded the prefix"
        with pytest.raises(StoreMisconfigured, match=rf"schema version {SCHEMA_VERSION + 1}, newer than"):
            await _client(redis_url, key_prefix, monkeypatch, SCHEMA_VERSION)  # an old gateway (re)starting
        # a new prefix (the documented way to run both while a schema change rolls out) takes the old release
        side = await _client(redis_url, key_prefix + "blue:", monkeypatch, SCHEMA_VERSION)
        await side._redis.delete(KeyLayout(key_prefix + "blue:").schema())
        await side.close()
    finally:
        await old._redis.delete(key)
        await old.close()
        await newer.close()


async def test_an_older_release_cannot_downgrade_a_prefix(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    current = await _client(redis_url, key_prefix, monkeypatch, SCHEMA_VERSION)
    key = KeyLayout(key_prefix).schema()
    try:
        with pytest.raises(StoreMisconfigured, match="Upgrade this process"):
            await _client(redis_url, key_prefix, monkeypatch, SCHEMA_VERSION - 1)
        assert await current._redis.get(key) == str(SCHEMA_VERSION), "the refused client wrote nothing"
    finally:
        await current._redis.delete(key)
        await current.close()
