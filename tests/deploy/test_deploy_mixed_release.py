"""Mixed gateway releases on one real Redis (issue 27, docs/operations/upgrades.md), with the previous release's
own code: its tree in a ``git worktree`` (``bench.gateway.baseline``, as ``gearshift bench gateway --baseline``
runs it), the ``gearshift gateway`` of each release started as deployed, both serving one tenant at once.

- Both releases share a schema version, so both start on one prefix, and a rate limit the two enforce together
  stays exact: of 60 requests sent to the two in turn, exactly the tenant's RPM (40) are served, the rest
  refused with 429, whichever release a request reached.
- The ledger holds exactly one record per served request, whichever release wrote it, and this release reads
  every one of them.
- A prefix that a newer gearshift has claimed (its schema version raised) locks the previous release out: its
  gateway exits at start, naming both versions and what to do.

When this release raised the schema version (``SCHEMA_VERSION`` above the previous release's), the two may not share a
prefix: then only the lock-out is checked, with this release's own gateway claiming the prefix.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from redis import Redis

from bench.gateway.baseline import checkout, gateway_entry
from bench.gateway.gearshift_target import bench_fleet
from bench.procs import Proc, free_port, spawn, wait_for_port, wait_http_ready, wait_until
from fleet.config import key_digest
from fleet.store.keys import SCHEMA_VERSION, KeyLayout
from fleet.store.protocol import UsageTotals
from fleet.store.redis import RedisStore

pytestmark = [pytest.mark.heavy, pytest.mark.redis]

PREVIOUS_RELEASE = "9e2bbd5"
"""The previous release's commit: the tree this release's work started from (2026-12-01, schema version 1).
Move it forward when a release is cut."""
RPM = 40
"""Under the size a rate limit is leased at with two replicas (a slice under 2 units), so every admit asks the
store: the limit is exact, the condition the test is about."""
KEY, PEPPER, ADMIN = "gs-mixed-key", "gs-mixed-pepper", "gs-mixed-admin-key-0123456789"
CHAT = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def previous_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with checkout(PREVIOUS_RELEASE, tmp_path_factory.mktemp("release") / "previous") as tree:
        yield tree


def _files(directory: Path, upstream: str) -> dict[str, str]:
    """The fleet and tenants files both releases read (defaults left out, as an operator writes them)."""
    fleet, tenants = directory / "fleet.yaml", directory / "tenants.yaml"
    fleet.write_text(yaml.safe_dump(bench_fleet(upstream).model_dump(mode="json", exclude_defaults=True)))
    tenants.write_text(
        yaml.safe_dump({
            "tiers": {"interactive": {"priority": 0}},
            "tenants": [{"id": "acme", "tier": "interactive", "rpm": RPM,
                         "keys": [{"id": "acme-1", "digest": key_digest(KEY, pepper=PEPPER)}]}],
        })
    )  # fmt: skip
    return {"GEARSHIFT_FLEET_FILE": str(fleet), "GEARSHIFT_TENANTS_FILE": str(tenants)}


def _gateway(name: str, source: Path | None, env: dict[str, str], log_dir: Path) -> tuple[Proc, str]:
    port = free_port()
    argv = [sys.executable, "-c", gateway_entry(source), "gateway", "--port", str(port)]
    proc = spawn(name, argv, log_dir=log_dir, env={**env, "GEARSHIFT_SPOOL_DIR": str(log_dir / f"spool-{name}")})
    return proc, f"http://127.0.0.1:{port}"


def _schema_of(tree: Path) -> int:
    """The ``SCHEMA_VERSION`` of the release at ``tree``."""
    found = re.search(r"^SCHEMA_VERSION = (\d+)$", (tree / "fleet" / "store" / "keys.py").read_text(), re.MULTILINE)
    assert found is not None, "no SCHEMA_VERSION in the previous release"
    return int(found.group(1))


def _served(url: str) -> int:
    with httpx.Client(timeout=30.0, headers={"authorization": f"Bearer {KEY}"}) as client:
        return client.post(f"{url}/v1/chat/completions", json=CHAT).status_code


@pytest.mark.timeout(400)  # three gateway starts and a worktree: over a minute here, several at a high load
async def test_two_releases_share_one_redis_with_exact_limits_and_the_schema_check(
    previous_tree: Path, redis_url: str, tmp_path: Path
) -> None:
    prefix = f"test:mixed:{time.time_ns()}:"
    upstream_port = free_port()
    upstream = spawn("upstream", [sys.executable, "-m", "bench.gateway.upstream", "--port", str(upstream_port)],
                     log_dir=tmp_path)  # fmt: skip
    env = {
        **_files(tmp_path, f"http://127.0.0.1:{upstream_port}"),
        "GEARSHIFT_REDIS_URL": redis_url, "GEARSHIFT_KEY_PREFIX": prefix, "GEARSHIFT_KEY_PEPPER": PEPPER,
        "GEARSHIFT_ADMIN_KEY": ADMIN, "GEARSHIFT_CONTROL_TOKEN": ADMIN + "-control", "GEARSHIFT_LOG_LEVEL": "WARNING",
    }  # fmt: skip
    procs = [upstream]
    store = RedisStore.from_url(redis_url, prefix=prefix)
    previous_schema = _schema_of(previous_tree)
    try:
        assert wait_for_port(upstream_port, timeout_s=30, alive=upstream.alive), upstream.log_tail()
        if previous_schema == SCHEMA_VERSION:
            started = [_gateway("previous", previous_tree, env, tmp_path), _gateway("current", None, env, tmp_path)]
        else:  # this release raised the schema: its own claim of the prefix locks the previous release out
            started = [_gateway("current", None, env, tmp_path)]
        procs += [proc for proc, _ in started]
        for proc, url in started:
            wait_http_ready(proc, f"{url}/v1/models", headers={"authorization": f"Bearer {KEY}"}, timeout_s=120)
        claim = SCHEMA_VERSION
        if previous_schema == SCHEMA_VERSION:
            urls = [url for _, url in started]
            statuses = [_served(urls[i % 2]) for i in range(int(RPM * 1.5))]  # bounded: 1.5 x the limit, in 60 s
            assert statuses.count(200) == RPM, statuses
            assert statuses.count(429) == len(statuses) - RPM, statuses
            assert statuses[:RPM] == [200] * RPM  # each release served its half
            ledger = await _ledger_when_settled(store, expected=RPM)
            assert ledger.requests == RPM
            assert len({r.request_id for r in ledger.records}) == RPM  # one record per served request, all readable
            claim = SCHEMA_VERSION + 1
            Redis.from_url(redis_url).set(KeyLayout(prefix).schema(), str(claim))  # a newer release's claim

        again, _ = _gateway("previous-again", previous_tree, env, tmp_path)
        procs.append(again)
        assert wait_until(lambda: not again.alive(), timeout_s=90), "the previous release started on a newer store"
        assert again.popen.returncode != 0
        log = again.log_path.read_text(errors="replace")  # whole: the old release's shutdown traceback can follow
        assert f"schema version {claim}, newer than this gearshift's {previous_schema}" in log
    finally:
        for proc in procs:
            proc.stop()
        await store.close()


async def _ledger_when_settled(store: RedisStore, *, expected: int) -> UsageTotals:
    """The tenant's ledger once ``expected`` records are in (the gateways write them after the response), or as it
    is after 30 s."""
    deadline = time.monotonic() + 30.0
    while True:
        totals = await store.usage("acme", since=0.0, until=time.time() + 60.0)
        if totals.requests >= expected or time.monotonic() > deadline:
            return totals
        await asyncio.sleep(0.2)
