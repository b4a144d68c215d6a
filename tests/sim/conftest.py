"""Fixtures for the simulated worker's server tests: real servers on loopback, free ports, fast clocks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from workers.sim.settings import SimWorkerSettings

from .server_helpers import CONTROL_TOKEN, ThreadedSimServer

SPEEDUP = 50.0
"""Simulated seconds per real second in server tests (a Kimi K3 step of ~25 ms takes ~0.5 ms)."""


def sim_settings(**overrides: Any) -> SimWorkerSettings:
    values: dict[str, Any] = {
        "port": 0,
        "speedup": SPEEDUP,
        "control_token": CONTROL_TOKEN,
        "context_window": 32_768,
        **overrides,
    }
    return SimWorkerSettings(**values)


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    """Base URL of a simulated worker shared by a test module."""
    with ThreadedSimServer(sim_settings()) as server:
        yield server.url


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    """A plain HTTP client (one per test: creating clients is slow)."""
    with httpx.Client(timeout=30) as client:
        yield client


@pytest.fixture
def start_sim() -> Iterator[Callable[..., ThreadedSimServer]]:
    """Start a dedicated simulated worker with the given settings; stopped after the test."""
    with ExitStack() as stack:

        def start(**overrides: Any) -> ThreadedSimServer:
            return stack.enter_context(ThreadedSimServer(sim_settings(**overrides)))

        yield start
