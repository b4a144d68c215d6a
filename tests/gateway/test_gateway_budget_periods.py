"""Budget periods across a reset (issue 27), on the memory store and a real Redis, with the clock injected and
set just before a UTC midnight: the budget resets at the period's first instant, even inside the life of a budget
lease that saw the old period's spend; the Retry-After of a refusal is the time to the reset; and with two replicas
under leases each period's spend stays within the budget plus one request, every period counter equal to what the
ledger holds for that period."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import httpx
import pytest

from fleet.budget_period import budget_key, period_span
from fleet.clock import ManualClock
from fleet.config import TenantConfig
from fleet.store.memory import MemoryStore
from fleet.store.protocol import Admission, Limit, Store, UsageRecord
from fleet.store.redis import RedisStore
from gateway.errors import BudgetExceeded, StoreUnavailable
from gateway.intake.admission import Admitter
from gateway.intake.leases import LeaseBook, LeasePolicy
from gateway.usage.metrics import GatewayMetrics
from gearshift.cli.usage_budgets import budget_table, fetch_budgets
from tests.console.test_console_app import console_gateway, logged_in

from .harness import ADMIN_KEY, KEYS, StartUpstreams, make_fleet, make_tenants, serve_gateway
from .test_gateway_tenants_admin import CHAT, admin

MIDNIGHT = datetime(2026, 12, 3, tzinfo=UTC).timestamp()
DAY_S = 86400.0


class CountingStore:
    """A ``Store`` that counts the admit calls reaching the wrapped one (Admitter's and the leases')."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.admits = 0

    async def admit(self, limits: Sequence[Limit], *, now: float) -> Admission:
        self.admits += 1
        return await self.inner.admit(limits, now=now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request: pytest.FixtureRequest, key_prefix: str) -> AsyncIterator[CountingStore]:
    if request.param == "memory":
        inner: Store = MemoryStore(clock=ManualClock())
    else:
        inner = RedisStore.from_url(request.getfixturevalue("redis_url"), prefix=key_prefix, server_clock=False)
    yield CountingStore(inner)
    await inner.close()


@pytest.fixture
def key_prefix() -> str:
    return f"test:{uuid.uuid4().hex[:12]}:"


def _gate(store: CountingStore, clock: ManualClock, *, share: float = 1.0) -> Admitter:
    shared = cast(Store, store)
    leases = LeaseBook(shared, clock, share=lambda: share)
    return Admitter(shared, clock=clock, metrics=GatewayMetrics(), leases=leases)


async def _serve(
    gate: Admitter, store: CountingStore, tenant: TenantConfig, clock: ManualClock, n: int, usd: float
) -> bool:
    """One request of ``usd``, as the gateway runs it: admit, finish, its usage record to the ledger (finished now),
    the landing heard. False when the budget refused it."""
    try:
        ticket = await gate.admit(tenant, request_id=f"r{n}", tokens=1)
    except BudgetExceeded:
        return False
    await gate.finish(ticket, used_tokens=1, cost_usd=usd)
    record = UsageRecord(
        request_id=f"r{n}", tenant=tenant.id, model="m", worker_id=None, prompt_tokens=1, completion_tokens=0,
        cost_usd=usd, status="ok", at=clock.wall(),
    )  # fmt: skip
    await store.inner.append_usage(record)
    gate.usage_landed([record])
    assert gate.leases is not None
    await gate.leases.idle()
    return True


async def test_a_daily_budget_resets_at_midnight_inside_a_lease_life(store: CountingStore) -> None:
    clock = ManualClock(MIDNIGHT - 1.5)
    gate = _gate(store, clock)
    tenant = TenantConfig(id="acme", tier="standard", budget_usd=1.0, budget_period="daily")
    assert await _serve(gate, store, tenant, clock, 0, 1.0)
    with pytest.raises(BudgetExceeded) as refused:
        await gate.admit(tenant, request_id="r1", tokens=1)
    assert refused.value.retry_after_s == pytest.approx(1.5)  # until the reset, not an hour
    assert "daily budget" in str(refused.value)
    clock.advance(1.0)
    assert not await _serve(gate, store, tenant, clock, 2, 0.5)
    clock.advance(1.0)  # 00:00:00.5: the old day's spend, last seen 1 s ago, is still fresh for the lease
    assert LeasePolicy().ttl_s > 1.0
    assert await _serve(gate, store, tenant, clock, 3, 0.75)
    assert await _serve(gate, store, tenant, clock, 4, 0.25)
    assert not await _serve(gate, store, tenant, clock, 5, 0.25)
    assert await store.inner.spent(budget_key("acme", "daily", MIDNIGHT - 1)) == 1.0
    assert await store.inner.spent(budget_key("acme", "daily", MIDNIGHT)) == 1.0
    assert await store.inner.spent("spend:acme") == 2.0


async def test_a_lifetime_budget_does_not_reset_at_midnight(store: CountingStore) -> None:
    clock = ManualClock(MIDNIGHT - 1.0)
    gate = _gate(store, clock)
    tenant = TenantConfig(id="acme", tier="standard", budget_usd=1.0)
    assert await _serve(gate, store, tenant, clock, 0, 1.0)
    clock.advance(DAY_S)
    with pytest.raises(BudgetExceeded) as refused:
        await gate.admit(tenant, request_id="r1", tokens=1)
    assert refused.value.retry_after_s == 3600.0


BUDGET_USD = 2.0
COST_USD = 0.001
STEP_S = 0.125
"""Two replicas take turns, one request every ``STEP_S``: each spends 0.008 USD per lease life (2 s), under its
budget headroom (2 × 0.005 × 0.5 × 2 USD = 0.01), the regime in which a budget lease does not overshoot."""


async def test_two_leased_replicas_keep_each_period_within_its_budget_across_midnight(store: CountingStore) -> None:
    clock = ManualClock(MIDNIGHT - 60.0)
    gates = [_gate(store, clock, share=0.5), _gate(store, clock, share=0.5)]
    tenant = TenantConfig(id="acme", tier="standard", budget_usd=BUDGET_USD, budget_period="daily")
    await store.inner.settle(
        windows=(), slots=(), spend={budget_key("acme", "daily", clock.wall()): BUDGET_USD - 0.3}, now=clock.wall()
    )  # the old day is nearly spent: it runs out about 37 s before midnight
    served = {"old": 0, "new": 0}
    admits_new_day = 0
    for n in range(int((60.0 + 280.0) / STEP_S)):  # bounded: 60 s before midnight, 280 s after
        day = "old" if clock.wall() < MIDNIGHT else "new"
        before = store.admits
        served[day] += await _serve(gates[n % 2], store, tenant, clock, n, COST_USD)
        admits_new_day += (store.admits - before) if day == "new" else 0
        clock.advance(STEP_S)
    old = await store.inner.spent(budget_key("acme", "daily", MIDNIGHT - 1))
    new = await store.inner.spent(budget_key("acme", "daily", MIDNIGHT))
    assert BUDGET_USD - COST_USD <= old <= BUDGET_USD + COST_USD + 1e-9
    assert BUDGET_USD - COST_USD <= new <= BUDGET_USD + COST_USD + 1e-9  # the new day got its whole budget
    assert served["old"] == pytest.approx(0.3 / COST_USD, abs=1)
    ledger_old = await store.inner.usage("acme", since=MIDNIGHT - DAY_S, until=MIDNIGHT)
    ledger_new = await store.inner.usage("acme", since=MIDNIGHT, until=MIDNIGHT + DAY_S)
    assert ledger_old.cost_usd == pytest.approx(old - (BUDGET_USD - 0.3), abs=1e-9)
    assert ledger_new.cost_usd == pytest.approx(new, abs=1e-9)
    assert ledger_new.requests == served["new"]
    assert admits_new_day < served["new"] / 2  # the new day's budget was served under leases, not per request


async def test_the_admin_api_shows_the_period_and_resets_only_the_current_one(upstreams: StartUpstreams) -> None:
    """A real gateway (memory store, the system clock): a monthly period, so a run meets its reset only at a
    month's end."""
    (w,) = await upstreams(1)
    async with serve_gateway(make_fleet([w.url]), make_tenants()) as g, admin(g.url) as a:
        r = await a.patch("/admin/v1/tenants/alpha", json={"budget_usd": 5.0, "budget_period": "monthly"})
        assert r.status_code == 200, r.text
        now = g.gw.clock.wall()
        span = period_span("monthly", now)
        view = r.json()
        assert (view["budget_period"], view["period_started_at"], view["next_reset_at"]) == (
            "monthly", span.start, span.end
        )  # fmt: skip
        month, lifetime = budget_key("alpha", "monthly", now), "spend:alpha"
        await g.store.settle(windows=(), slots=(), spend={month: 5.0, lifetime: 8.0}, now=now)
        assert (await a.get("/admin/v1/tenants/alpha")).json()["spent_usd"] == 5.0
        async with httpx.AsyncClient(base_url=g.url, headers={"authorization": f"Bearer {KEYS['alpha']}"}) as c:
            refused = await c.post("/v1/chat/completions", json=CHAT)
            assert (refused.status_code, refused.json()["error"]["type"]) == (429, "insufficient_quota")
            assert abs(int(refused.headers["retry-after"]) - (span.end - g.gw.clock.wall())) < 5
            reset = (await a.post("/admin/v1/tenants/alpha/budget/reset")).json()
            assert (reset["spent_before_usd"], reset["budget_period"], reset["next_reset_at"]) == (
                5.0, "monthly", span.end
            )  # fmt: skip
            assert await g.store.spent(month) == 0.0
            assert await g.store.spent(lifetime) == 8.0  # the lifetime total is not this period's
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
        for _ in range(100):  # bounded: until the last request's usage record has billed the lifetime counter
            if await g.store.spent(lifetime) > 8.0:
                break
            await asyncio.sleep(0.05)
        total = (await a.patch("/admin/v1/tenants/alpha", json={"budget_period": "total"})).json()
        assert (total["period_started_at"], total["next_reset_at"]) == (None, None)
        assert total["spent_usd"] == await g.store.spent(lifetime) > 8.0


class FlakyStore(CountingStore):
    """A store that fails every admit while ``down`` (an outage, as the admitter sees one)."""

    down = False

    async def admit(self, limits: Sequence[Limit], *, now: float) -> Admission:
        if self.down:
            raise ConnectionError("store down")
        return await super().admit(limits, now=now)


async def test_an_outage_across_midnight_starts_the_new_day_at_zero_for_a_replica_that_saw_the_old_one() -> None:
    """Failing open, a replica spends its share of what was left of the last spend it saw; a period that began
    during the outage has nothing billed from before it, so a replica that saw the old day's spend gets its share of
    the new day's whole budget (not a 503), and one that never saw the tenant's spend still refuses with 503."""
    clock = ManualClock(MIDNIGHT - 10.0)
    store = FlakyStore(MemoryStore(clock=clock))
    gate = Admitter(cast(Store, store), clock=clock, metrics=GatewayMetrics(), local_share=0.5)
    stranger = Admitter(cast(Store, store), clock=clock, metrics=GatewayMetrics(), local_share=0.5)
    tenant = TenantConfig(id="acme", tier="standard", budget_usd=1.0, budget_period="daily")
    await store.inner.settle(windows=(), slots=(), spend={budget_key("acme", "daily", clock.wall()): 1.0}, now=0.0)
    with pytest.raises(BudgetExceeded):  # the old day is spent, as the store says
        await gate.admit(tenant, request_id="r0", tokens=1)
    store.down = True
    with pytest.raises(BudgetExceeded):  # still the old day: its last known spend holds
        await gate.admit(tenant, request_id="r1", tokens=1)
    clock.advance(20.0)  # past midnight, the store still away
    spent = 0.0
    for n in range(10):  # bounded: twice what the share allows
        try:
            ticket = await gate.admit(tenant, request_id=f"n{n}", tokens=1)
        except BudgetExceeded:
            continue
        await gate.finish(ticket, used_tokens=1, cost_usd=0.1)
        spent += 0.1
    assert spent == pytest.approx(0.5)  # its share (0.5) of the new day's 1 USD
    with pytest.raises(StoreUnavailable):
        await stranger.admit(tenant, request_id="s0", tokens=1)


async def test_the_cli_shows_each_budget_its_period_spend_and_next_reset(upstreams: StartUpstreams) -> None:
    """``gearshift usage budgets`` against a real gateway, run as an operator would (a subprocess)."""
    (w,) = await upstreams(1)
    tenants = make_tenants(alpha={"budget_usd": 5.0, "budget_period": "weekly"}, beta={"budget_usd": 2.0})
    async with serve_gateway(make_fleet([w.url]), tenants) as g:
        now = g.gw.clock.wall()
        await g.store.settle(windows=(), slots=(), spend={budget_key("alpha", "weekly", now): 1.25}, now=now)
        views = await fetch_budgets(g.url, ADMIN_KEY)
        env = {**os.environ, "GEARSHIFT_ADMIN_KEY": ADMIN_KEY}
        run = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gearshift", "usage", "budgets", "--gateway", g.url, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(run.communicate(), timeout=60)
    assert run.returncode == 0, err.decode()
    assert [v["id"] for v in views] == ["alpha", "beta"]  # gamma has no budget
    week = period_span("weekly", now)
    start, reset = (datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") for t in (week.start, week.end))
    lines = out.decode().splitlines()
    assert lines[0].split() == [
        "tenant",
        "budget_usd",
        "period",
        "spent_usd",
        "left_usd",
        "period_started",
        "next_reset",
    ]
    assert lines[1].split() == ["alpha", "5.00", "weekly", "1.25", "3.75", *start.split(), *reset.split()]
    assert lines[2].split() == ["beta", "2.00", "total", "0.00", "2.00", "-", "-"]
    assert budget_table(views) == out.decode().rstrip("\n")


async def test_the_console_sets_the_period_and_shows_the_next_reset(upstreams: StartUpstreams) -> None:
    async with console_gateway(upstreams) as g, g.admin() as api, logged_in(g) as (client, csrf):
        form = {"csrf": csrf, "id": "delta", "tier": "batch", "budget_usd": "2", "budget_period": "daily"}
        assert (await client.post("/console/tenants", data=form)).status_code == 303
        view = (await api.get("/admin/v1/tenants/delta")).json()
        assert (view["budget_usd"], view["budget_period"]) == (2.0, "daily")
        page = (await client.get("/console/tenants/delta")).text
        reset = datetime.fromtimestamp(view["next_reset_at"], UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        assert f'<span class="next-reset">{reset}</span>' in page
        assert '<option value="daily" selected>' in page  # the edit form shows the period in force
