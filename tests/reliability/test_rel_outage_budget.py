"""Defect 4 (issue 23): failing open must not reset tenant budgets. The gateway's admitter on a real Redis that
then stops: while the store is away, a replica enforces its share of what was left of each budget at the last
spend the store reported (``Admission.spent_usd``), and refuses a budgeted tenant whose spend it never saw.

Before the fix the fallback store held no past spend: a tenant with a $10 budget and $12 spent was admitted every
request during the outage, and one with $9.50 spent got $10 more."""

from __future__ import annotations

import pytest

from bench.procs import Proc
from fleet.clock import SystemClock
from fleet.config import TenantConfig
from fleet.store.protocol import UsageRecord
from fleet.store.redis import RedisStore
from gateway.errors import BudgetExceeded, StoreUnavailable
from gateway.intake.admission import Admitter
from gateway.usage.metrics import GatewayMetrics

from .rel_types import StartRedis

pytestmark = pytest.mark.redis

BUDGET_USD = 10.0
COST_USD = 1.0
"""What each request costs here (its usage record's cost)."""


def _tenant(tenant_id: str) -> TenantConfig:
    return TenantConfig(id=tenant_id, tier="standard", budget_usd=BUDGET_USD)


async def _spend(store: RedisStore, tenant: str, usd: float) -> None:
    """Bill ``usd`` the way the gateway does: one usage record (its cost goes to the spend counter)."""
    record = UsageRecord(
        request_id=f"past-{tenant}", tenant=tenant, model="m", worker_id=None, prompt_tokens=1, completion_tokens=1,
        cost_usd=usd, status="ok", at=SystemClock().wall(),
    )  # fmt: skip
    await store.append_usage(record)


async def _admitted_during_outage(admitter: Admitter, tenant: TenantConfig, attempts: int) -> int:
    """How many of ``attempts`` requests (each costing ``COST_USD``) are admitted; a refusal must name the budget."""
    admitted = 0
    for i in range(attempts):
        try:
            ticket = await admitter.admit(tenant, request_id=f"{tenant.id}-{i}", tokens=10)
        except BudgetExceeded:
            continue
        admitted += 1
        await admitter.finish(ticket, used_tokens=10, cost_usd=COST_USD)
    return admitted


def _admitter(store: RedisStore) -> Admitter:
    return Admitter(store, clock=SystemClock(), metrics=GatewayMetrics(), failure_mode="open", local_share=1.0)


async def _outage(redis: Proc) -> None:
    assert redis.terminate() == 0


async def test_an_outage_keeps_the_last_known_spend(own_redis: StartRedis) -> None:
    redis = own_redis(persist=False)
    store = RedisStore.from_url(redis.url, prefix="budget:", wait_s=0.5)
    admitter = _admitter(store)
    over, under = _tenant("over"), _tenant("under")
    try:
        await _spend(store, "over", 12.0)
        await _spend(store, "under", 9.5)
        with pytest.raises(BudgetExceeded):
            await admitter.admit(over, request_id="before", tokens=10)  # the store says: spent
        ticket = await admitter.admit(under, request_id="before", tokens=10)
        await admitter.finish(ticket, used_tokens=10, cost_usd=0.0)
        await _outage(redis)
        assert await _admitted_during_outage(admitter, over, 10) == 0
        # $0.50 was left: this replica (share 1) admits while its unbilled spend is below that, so one $1 request
        assert await _admitted_during_outage(admitter, under, 10) == 1
    finally:
        await store.close()


async def test_a_budget_never_seen_is_not_enforced_from_nothing(own_redis: StartRedis) -> None:
    """A replica that has not read a tenant's spend since it started cannot know what is left: it refuses with
    503 and ``Retry-After`` rather than admitting the whole budget again."""
    redis = own_redis(persist=False)
    store = RedisStore.from_url(redis.url, prefix="budget:", wait_s=0.5)
    try:
        await _spend(store, "over", 12.0)
        await _outage(redis)
        with pytest.raises(StoreUnavailable):
            await _admitter(store).admit(_tenant("over"), request_id="r", tokens=10)
        unbudgeted = TenantConfig(id="free", tier="standard", rpm=100)
        assert (await _admitter(store).admit(unbudgeted, request_id="r", tokens=10)).local  # other limits: open
    finally:
        await store.close()
