"""Reliability fixtures: real child processes (simulated workers, redis-server) stopped after each test."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from bench.procs import Proc, start_redis, start_sim

from .rel_types import StartRedis, StartSims


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[list[Proc]]:
    """Every child a test starts goes in here and is stopped (SIGCONT, SIGTERM, SIGKILL) at the end."""
    started: list[Proc] = []
    yield started
    for proc in reversed(started):
        proc.stop()


@pytest.fixture(scope="session")
def shared_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Proc]]:
    """Two simulated worker processes (speedup 200) shared by the tests that neither kill, pause nor count on
    them being idle."""
    log_dir = tmp_path_factory.mktemp("shared-workers")
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(start_sim, f"shared-{i}", log_dir=log_dir, speedup=200.0, seed=i) for i in range(2)]
    started = [f.result() for f in futures]
    yield started
    for proc in started:
        proc.stop()


@pytest.fixture
def sims(procs: list[Proc], tmp_path: Path) -> StartSims:
    """Factory: ``await sims(2, speedup=5)`` starts simulated worker processes concurrently."""

    async def start(n: int, *, speedup: float = 20.0, extra: tuple[str, ...] = (), **kw: Any) -> list[Proc]:
        jobs = [
            asyncio.to_thread(start_sim, f"r{len(procs) + i}", log_dir=tmp_path, speedup=speedup, extra=extra, **kw)
            for i in range(n)
        ]
        started = await asyncio.gather(*jobs, return_exceptions=True)
        for p in started:
            if isinstance(p, Proc):
                procs.append(p)
        for p in started:
            if isinstance(p, BaseException):
                raise p
        return [p for p in started if isinstance(p, Proc)]

    return start


@pytest.fixture
def own_redis(procs: list[Proc], tmp_path: Path) -> StartRedis:
    """Factory for a redis-server this test owns (so it may stop and restart it)."""

    def start(*, port: int | None = None, persist: bool = True) -> Proc:
        proc = start_redis(log_dir=tmp_path / "redis", port=port, persist=persist)
        procs.append(proc)
        return proc

    return start
