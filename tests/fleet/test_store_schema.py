"""The store's schema version (issue 27) on a real Redis and a Redis Cluster: a fresh prefix is claimed for this
gearshift's version, a store written by a newer gearshift is refused at start with a message that says what to
do, an older one is upgraded, and another prefix is independent."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

import pytest

from bench.procs import free_port
from fleet.store.keys import SCHEMA_VERSION, KeyLayout, StoreMisconfigured
from fleet.store.redis import RedisStore
from tests.fleet.conftest import redis_store


async def test_the_schema_version_is_claimed_refused_when_newer_and_upgraded_when_older(
    request: pytest.FixtureRequest, redis_kind: str, key_prefix: str
) -> None:
    store = await redis_store(request, redis_kind, key_prefix)  # verify() ran: the prefix is claimed
    key = KeyLayout(key_prefix).schema()
    raw = store._redis
    try:
        assert await raw.get(key) == str(SCHEMA_VERSION)
        await raw.set(key, str(SCHEMA_VERSION + 1))
        with pytest.raises(StoreMisconfigured, match=rf"schema version {SCHEMA_VERSION + 1}, newer than .* Upgrade"):
            await store.verify()
        await raw.set(key, "0")
        await store.verify()
        assert await raw.get(key) == str(SCHEMA_VERSION), "an older layout is upgraded"
        other = await redis_store(request, redis_kind, key_prefix + "other:")
        await other.close()
    finally:
        await raw.delete(key)
        await store.close()


@pytest.mark.redis
async def test_a_gateway_refuses_to_start_on_a_store_of_a_newer_gearshift(redis_url: str, key_prefix: str) -> None:
    """The real ``gearshift gateway`` process: it exits at start, naming the versions and what to do."""
    store = RedisStore.from_url(redis_url, prefix=key_prefix)
    await store._redis.set(KeyLayout(key_prefix).schema(), str(SCHEMA_VERSION + 5))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GEARSHIFT_")},
        "GEARSHIFT_REDIS_URL": redis_url, "GEARSHIFT_KEY_PREFIX": key_prefix, "GEARSHIFT_ALLOW_DEV_SECRETS": "1",
        "GEARSHIFT_PORT": str(free_port()), "GEARSHIFT_SPOOL_DIR": str(Path(tempfile.mkdtemp()) / "spool"),
    }  # fmt: skip
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gearshift", "gateway", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode != 0
        assert f"schema version {SCHEMA_VERSION + 5}, newer than this gearshift's {SCHEMA_VERSION}" in output.decode()
    finally:
        await store._redis.delete(KeyLayout(key_prefix).schema())
        await store.close()
