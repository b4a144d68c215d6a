"""Types of the reliability fixtures (kept out of ``conftest`` so test modules can import them)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from bench.procs import Proc

StartSims = Callable[..., Awaitable[list[Proc]]]
"""``await sims(n, speedup=…)``: start ``n`` simulated worker processes."""
StartRedis = Callable[..., Proc]
"""``own_redis(port=…, persist=…)``: start a redis-server this test owns."""
