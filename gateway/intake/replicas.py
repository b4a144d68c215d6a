"""How many gateway replicas share the store, so that each enforces its share of a limit during an outage.

Every replica heartbeats into the store's replica registry (``Store.replica_heartbeat``, TTL three intervals) and
keeps the last count it saw. While the store is away the count is the one from before the outage, never below
the ``GEARSHIFT_GATEWAY_REPLICAS`` setting, so the fleet-wide limit holds: N replicas × limit / N.
"""

from __future__ import annotations

import uuid

from fleet.clock import Clock
from fleet.store.protocol import Store
from gateway.settings import GatewaySettings

HEARTBEAT_PERIODS_TTL = 3
"""A replica counts until this many heartbeat intervals pass without one."""


class ReplicaRegistry:
    """This replica's view of the replica count. ``beat`` runs every ``interval_s`` seconds."""

    def __init__(self, store: Store, *, clock: Clock, floor: int, cap: float, interval_s: float) -> None:
        self._store = store
        self._clock = clock
        self._floor = floor
        self._cap = cap
        self._ttl_s = HEARTBEAT_PERIODS_TTL * interval_s
        self.replica_id = f"gw-{uuid.uuid4().hex[:12]}"
        self.count = floor
        """Replicas alive at the last heartbeat (at least ``floor``)."""

    @classmethod
    def from_settings(cls, store: Store, *, clock: Clock, settings: GatewaySettings) -> ReplicaRegistry:
        s = settings
        return cls(store, clock=clock, floor=s.gateway_replicas, cap=s.local_limit_share,
                   interval_s=s.replica_heartbeat_s)  # fmt: skip

    async def beat(self) -> None:
        """Heartbeat once and refresh ``count``; a store error leaves the last count in place."""
        alive = await self._store.replica_heartbeat(self.replica_id, ttl_s=self._ttl_s, now=self._clock.wall())
        self.count = max(self._floor, alive)

    def share(self) -> float:
        """The share of each limit this replica enforces alone while the store is away: min(cap, 1 / count)."""
        return min(self._cap, 1.0 / self.count)
