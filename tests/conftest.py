"""Root fixtures shared by every test area: a clean ``GEARSHIFT_*`` environment for each test, a real
``redis-server`` and a real Redis Cluster (3 masters, 3 replicas) on loopback; and the order of the heavy checks.
Keep this file generic; area fixtures live in ``tests/<area>/conftest.py``."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from bench.procs import ProcessFailed, start_redis, start_redis_cluster

HEAVY_LAST = "tests/deploy/test_deploy_compose_docker.py"
"""The compose check: scripts/heavy-tests.sh builds its images in the background while the other heavy checks run."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The heavy checks in the order scripts/heavy-tests.sh wants: the real-vLLM ones first (they bear the background
    image build best: long start-up limits, no timing asserted), the compose check last (by then its images are
    built). Every other test keeps its place (a stable sort; a test not marked heavy is never moved)."""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("heavy") is None:
            return 1
        if item.nodeid.startswith(HEAVY_LAST):
            return 2
        return 0 if item.get_closest_marker("vllm") is not None else 1

    items.sort(key=rank)


@pytest.fixture(autouse=True)
def _clean_gearshift_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove every ``GEARSHIFT_*`` variable for the test, so a variable exported in the developer's shell
    never changes what a test sees; a test that needs one sets it (``monkeypatch.setenv`` or an ``env=``)."""
    for name in [n for n in os.environ if n.startswith("GEARSHIFT_")]:
        monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a real redis-server started for this test session on 127.0.0.1 (stopped at the end).
    Tests share it: isolate with a unique key prefix."""
    try:
        proc = start_redis(log_dir=tmp_path_factory.mktemp("redis"))
    except ProcessFailed as exc:
        pytest.fail(f"{exc} (or `apt-get install redis-server`)", pytrace=False)
    try:
        yield proc.url
    finally:
        proc.stop(timeout_s=10.0)


@pytest.fixture(scope="session")
def redis_cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of one node of a real Redis Cluster (3 masters, 3 replicas) started for this test session on
    127.0.0.1 (stopped at the end); connect with ``GEARSHIFT_REDIS_CLUSTER`` semantics (the cluster client).
    Tests share it: isolate with a unique key prefix."""
    try:
        cluster = start_redis_cluster(log_dir=tmp_path_factory.mktemp("redis-cluster"))
    except ProcessFailed as exc:
        pytest.fail(f"{exc} (or `apt-get install redis-server redis-tools`)", pytrace=False)
    try:
        yield cluster.url
    finally:
        cluster.stop(timeout_s=10.0)
