"""``bench.procs.start_redis_cluster`` when a node loses the port race: the port it picked (or that port's cluster
bus port, +10 000) is taken by another process before redis-server binds it. The node starts again on a fresh
port and the cluster forms; a real redis-server and a real listening socket make the race."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bench.procs import ProcessFailed, free_cluster_port, redis_cluster_ok, start_redis_cluster

BUS_OFFSET = 10_000


@contextmanager
def listening(port: int) -> Iterator[None]:
    """Another process's listener on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield


def taken_first(port: int) -> Callable[[], int]:
    """A port picker that hands out ``port`` first, then free cluster ports."""
    handed: list[int] = []

    def pick() -> int:
        handed.append(port if not handed else free_cluster_port())
        return handed[-1]

    return pick


@pytest.mark.parametrize("taken", ["port", "bus port"])
def test_a_node_that_lost_its_port_starts_again_on_a_fresh_one(taken: str, tmp_path: Path) -> None:
    port = free_cluster_port()  # it and its bus port free: the test takes one
    with listening(port if taken == "port" else port + BUS_OFFSET):
        cluster = start_redis_cluster(log_dir=tmp_path, replicas_per_master=0, pick_port=taken_first(port))
        try:
            assert port not in [node.port for node in cluster.nodes]
            assert all(redis_cluster_ok(node.port) for node in cluster.nodes)
            assert "already in use" in (tmp_path / "redis-node-0.log").read_text().lower()
        finally:
            cluster.stop()


def test_a_node_that_fails_for_another_reason_is_not_started_again(tmp_path: Path) -> None:
    picks: list[int] = []

    def pick() -> int:
        picks.append(70_000)
        return picks[-1]  # not a port: redis-server refuses it without binding anything

    with pytest.raises(ProcessFailed, match="did not answer PING"):
        start_redis_cluster(log_dir=tmp_path, replicas_per_master=0, pick_port=pick)
    assert len(picks) == 1
