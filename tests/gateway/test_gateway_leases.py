"""Quota leases (gateway.intake.leases): a tenant under a lease is admitted without the store, the fleet's
over-admission stays within the leases outstanding, TPM corrections and unused slices return to the store, and
concurrency stays exact."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from fleet.clock import ManualClock
from fleet.config import TenantConfig
from fleet.store.memory import MemoryStore
from fleet.store.protocol import Admission, Limit, WindowLimit
from gateway.errors import RateLimited
from gateway.intake.admission import Admitter
from gateway.intake.leases import LeaseBook, LeasePolicy
from gateway.usage.metrics import GatewayMetrics


class CountingStore(MemoryStore):
    """A memory store that counts its admit calls (the round trips a Redis store would make)."""

    def __init__(self, *, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.admits = 0

    async def admit(self, limits: Sequence[Limit], *, now: float) -> Admission:
        self.admits += 1
        return await super().admit(limits, now=now)


def admitter(
    store: MemoryStore, clock: ManualClock, *, share: float = 1.0, policy: LeasePolicy | None = None
) -> Admitter:
    leases = LeaseBook(store, clock, share=lambda: share, policy=policy or LeasePolicy())
    return Admitter(store, clock=clock, metrics=GatewayMetrics(), leases=leases)


async def settle_leases(*admitters: Admitter) -> None:
    for a in admitters:
        assert a.leases is not None
        await a.leases.idle()


async def test_a_tenant_under_a_lease_is_admitted_without_the_store() -> None:
    clock = ManualClock()
    store = CountingStore(clock=clock)
    gate = admitter(store, clock)
    tenant = TenantConfig(id="acme", tier="standard", rpm=100_000, tpm=100_000_000, budget_usd=1_000.0)
    for i in range(400):
        await gate.admit(tenant, request_id=f"r{i}", tokens=100)
        await settle_leases(gate)
        clock.advance(0.001)
    # a lease is 500 requests / 500 000 tokens: a handful of grants and spend reads, not one call per request
    assert store.admits < 400 / 10


async def test_a_small_limit_is_not_leased_and_stays_exact() -> None:
    clock = ManualClock()
    store = CountingStore(clock=clock)
    gate = admitter(store, clock)
    tenant = TenantConfig(id="small", tier="standard", rpm=50)
    for i in range(50):
        await gate.admit(tenant, request_id=f"r{i}", tokens=1)
    with pytest.raises(RateLimited):
        await gate.admit(tenant, request_id="r50", tokens=1)
    assert store.admits == 51


@pytest.mark.parametrize(("replicas", "policy"), [
    (1, LeasePolicy()), (2, LeasePolicy()), (3, LeasePolicy()),
    (2, LeasePolicy(fraction=0.01, max_outstanding=1)), (2, LeasePolicy(fraction=0.0025, refill_at=0.9)),
])  # fmt: skip
async def test_over_admission_stays_within_the_outstanding_leases(replicas: int, policy: LeasePolicy) -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    gates = [admitter(store, clock, share=1 / replicas, policy=policy) for _ in range(replicas)]
    limit = 20_000
    tenant = TenantConfig(id="acme", tier="standard", rpm=limit)
    size = policy.size(limit, 1 / replicas)
    assert size >= 2  # the limit is leased
    admitted = 0
    for i in range(int(limit * 1.2)):  # bounded: 20 % more attempts than the limit, inside one window
        gate = gates[i % replicas]
        try:
            await gate.admit(tenant, request_id=f"r{i}", tokens=1)
            admitted += 1
        except RateLimited:
            pass
        await settle_leases(*gates)
        clock.advance(30.0 / (limit * 1.2))  # 30 s of the 60 s window
    bound = policy.max_outstanding * size * replicas
    assert bound <= policy.max_outstanding * policy.fraction * limit  # the stated bound: 1 % with these policies
    assert limit - bound <= admitted <= limit + bound


async def test_tpm_corrections_and_unused_slices_return_to_the_store() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    gate = admitter(store, clock)
    limit = 10_000_000
    tenant = TenantConfig(id="acme", tier="standard", tpm=limit)
    for i in range(50):
        ticket = await gate.admit(tenant, request_id=f"r{i}", tokens=1_000)
        settlement = await gate.finish(ticket, used_tokens=400, cost_usd=0.0)
        if settlement is not None:  # admitted by the store before the first lease was granted
            await store.settle_many([settlement], now=clock.wall())
        await settle_leases(gate)
        clock.advance(0.05)
    await gate.close()
    used = 50 * 400  # the window holds what was used, whether the lease or the store reserved it
    fits = await store.admit([WindowLimit(key="tpm:acme", cost=limit - used, limit=limit)], now=clock.wall())
    assert fits.allowed
    over = await store.admit(  # the window is full now: one token more is refused
        [WindowLimit(key="tpm:acme", cost=1, limit=limit)], now=clock.wall()
    )
    assert not over.allowed


async def test_concurrency_stays_exact_under_leases() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    gate = admitter(store, clock)
    tenant = TenantConfig(id="acme", tier="standard", rpm=1_000_000, tpm=1_000_000_000, max_concurrency=3)
    tickets = []
    for i in range(3):
        tickets.append(await gate.admit(tenant, request_id=f"r{i}", tokens=10))
        await settle_leases(gate)
    with pytest.raises(RateLimited) as refused:
        await gate.admit(tenant, request_id="r3", tokens=10)
    assert refused.value.limit == "concurrency"
    settlement = await gate.finish(tickets[0], used_tokens=10, cost_usd=0.0)
    assert settlement is not None
    await store.settle_many([settlement], now=clock.wall())
    gate.settle_landed([settlement])
    await gate.admit(tenant, request_id="r4", tokens=10)
