"""Gateway fixtures: fake workers on loopback, stopped after each test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from .harness import FakeUpstream, StartUpstreams


@pytest.fixture
async def upstreams() -> AsyncIterator[StartUpstreams]:
    """Factory: ``await upstreams(2, chunks=8)`` starts fake workers, stopped after the test."""
    started: list[FakeUpstream] = []

    async def start(n: int, **kwargs: Any) -> list[FakeUpstream]:
        fakes = [await FakeUpstream(**kwargs).start() for _ in range(n)]
        started.extend(fakes)
        return fakes

    yield start
    for fake in started:
        await fake.stop()
