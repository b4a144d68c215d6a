"""Fail-open limits take a safe share: each replica knows how many replicas share the store (the store's replica
registry while it was up, never below ``GEARSHIFT_GATEWAY_REPLICAS``) and enforces limit / count alone."""

from __future__ import annotations

from collections.abc import Sequence

import httpx
import pytest

from fleet.clock import ManualClock
from fleet.store.memory import MemoryStore
from fleet.store.protocol import Admission, Limit
from gateway.errors import RateLimited
from gateway.intake.admission import Admitter
from gateway.intake.replicas import ReplicaRegistry
from gateway.usage.metrics import GatewayMetrics

from .harness import make_fleet, make_tenants, serve_gateway


class SwitchableStore(MemoryStore):
    """A memory store whose calls fail while ``down``."""

    down = False

    async def replica_heartbeat(self, replica_id: str, *, ttl_s: float, now: float) -> int:
        if self.down:
            raise ConnectionError("store down")
        return await super().replica_heartbeat(replica_id, ttl_s=ttl_s, now=now)

    async def admit(self, limits: Sequence[Limit], *, now: float) -> Admission:
        if self.down:
            raise ConnectionError("store down")
        return await super().admit(limits, now=now)

    async def ping(self) -> bool:
        return not self.down


def registry(store: MemoryStore, clock: ManualClock, *, floor: int = 1) -> ReplicaRegistry:
    return ReplicaRegistry(store, clock=clock, floor=floor, cap=1.0, interval_s=2.0)


async def test_the_share_follows_the_registry_and_outlives_an_outage() -> None:
    clock = ManualClock()
    store = SwitchableStore(clock=clock)
    a, b, c = registry(store, clock), registry(store, clock), registry(store, clock)
    for r in (a, b, c, a):
        await r.beat()
    assert a.count == 3
    assert a.share() == pytest.approx(1 / 3)
    store.down = True
    with pytest.raises(ConnectionError):
        await a.beat()
    assert a.count == 3  # the last count seen while the store was up
    tenant = make_tenants(alpha={"rpm": 9, "max_concurrency": 100}).tenants[0]
    admitter = Admitter(store, clock=clock, metrics=GatewayMetrics(), local_share=a.share)
    for i in range(3):
        assert (await admitter.admit(tenant, request_id=f"r{i}", tokens=1)).local
    with pytest.raises(RateLimited):  # a third of rpm 9, enforced locally
        await admitter.admit(tenant, request_id="r3", tokens=1)


async def test_the_setting_is_a_floor_and_lapsed_replicas_stop_counting() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    alone, other = registry(store, clock, floor=4), registry(store, clock)
    await other.beat()
    await alone.beat()
    await other.beat()
    assert (alone.count, other.count) == (4, 2)
    clock.advance(7.0)  # three 2 s intervals without a heartbeat from ``other``
    await alone.beat()
    assert alone.count == 4
    assert (await store.replica_heartbeat("probe", ttl_s=1, now=clock.wall())) == 2


async def test_readyz_shows_the_outage_and_the_share() -> None:
    clock = ManualClock()
    store = SwitchableStore(clock=clock)
    fleet, tenants = make_fleet(["http://127.0.0.1:1"]), make_tenants()
    async with (
        serve_gateway(fleet, tenants, store=store, gateway_replicas=2) as g,
        httpx.AsyncClient(base_url=g.url) as client,
    ):
        assert (await client.get("/readyz")).json()["store"] == "ok"
        store.down = True
        body = (await client.get("/readyz")).json()
    assert (body["store"], body["replicas"], body["fail_open_share"]) == ("unavailable", 2, 0.5)
    assert g.gw.metrics.store_up._value.get() == 0
