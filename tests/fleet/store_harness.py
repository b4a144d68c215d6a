"""The store harness of the fleet contract tests (imported by ``conftest`` and the tests)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fleet.clock import ManualClock
from fleet.store.protocol import Store

T0 = 1_700_000_000.25
"""A start time (Unix s) that is not on a bucket boundary."""


@dataclass
class StoreHarness:
    """A store plus a way to let its TTL clock run: the injected clock for memory, real time for Redis
    (whose own key expiry is what is under test there)."""

    kind: str
    store: Store
    clock: ManualClock

    async def elapse(self, seconds: float) -> None:
        if self.kind == "memory":
            self.clock.advance(seconds)
        else:
            await asyncio.sleep(seconds)
