"""Budget periods (``fleet.budget_period``, issue 27): UTC calendar periods, the counter a budget is checked
against, and the store billing each record to the counter of every period holding its ``at`` (memory, a real
Redis and a Redis Cluster), each period counter expiring one period after its end."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from fleet.budget_period import BudgetPeriod, billed_counters, budget_key, is_spend_key, period_span
from fleet.store.keys import KeyLayout
from fleet.store.memory import MemoryStore
from fleet.store.protocol import UsageRecord
from fleet.store.redis import RedisStore
from tests.fleet.store_harness import StoreHarness


def _at(*parts: int) -> float:
    return datetime(*parts, tzinfo=UTC).timestamp()  # type: ignore[arg-type, misc]


def _day(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


@pytest.mark.parametrize(
    ("period", "at", "start", "end"),
    [
        ("daily", _at(2026, 12, 2, 13, 5), _at(2026, 12, 2), _at(2026, 12, 3)),
        ("weekly", _at(2026, 12, 2, 13, 5), _at(2026, 11, 30), _at(2026, 12, 7)),
        ("weekly", _at(2027, 1, 1, 0, 0, 1), _at(2026, 12, 28), _at(2027, 1, 4)),
        ("monthly", _at(2026, 12, 31, 23, 59, 59), _at(2026, 12, 1), _at(2027, 1, 1)),
        ("monthly", _at(2028, 2, 29, 12), _at(2028, 2, 1), _at(2028, 3, 1)),
        ("daily", _at(2026, 12, 3), _at(2026, 12, 3), _at(2026, 12, 4)),
    ],
)
def test_periods_are_utc_calendar_periods(period: BudgetPeriod, at: float, start: float, end: float) -> None:
    span = period_span(period, at)
    assert (span.start, span.end) == (start, end)
    assert span.start <= at < span.end
    assert span.resets


def test_weeks_start_on_monday_and_the_total_never_resets() -> None:
    for day in range(14):
        span = period_span("weekly", _at(2026, 12, 1) + day * 86400 + 3600)
        assert _day(span.start).weekday() == 0
        assert span.end - span.start == 7 * 86400
    total = period_span("total", _at(2026, 12, 1))
    assert not total.resets
    assert total.start == -math.inf


def test_each_period_has_its_own_counter_named_by_its_first_day() -> None:
    at = _at(2026, 12, 2, 13, 5)
    assert budget_key("acme", "total", at) == "spend:acme"
    assert budget_key("acme", "daily", at) == "spend.daily.20261202:acme"
    assert budget_key("acme", "weekly", at) == "spend.weekly.20261130:acme"
    assert budget_key("acme", "monthly", at) == "spend.monthly.20261201:acme"
    assert budget_key("acme", "daily", _at(2026, 12, 3)) != budget_key("acme", "daily", _at(2026, 12, 2, 23, 59, 59))
    assert all(is_spend_key(c.key) for c in billed_counters("acme", at))
    assert not is_spend_key("rpm:acme")
    assert not is_spend_key("spender:acme")


def test_a_period_counter_expires_one_period_after_its_end() -> None:
    at = _at(2026, 12, 2, 13, 5)
    expiry = {c.key: c.expire_at for c in billed_counters("acme", at)}
    assert expiry["spend:acme"] is None
    assert expiry["spend.daily.20261202:acme"] == _at(2026, 12, 4)
    assert expiry["spend.weekly.20261130:acme"] == _at(2026, 12, 14)
    assert expiry["spend.monthly.20261201:acme"] == _at(2027, 1, 1) + 31 * 86400


def _record(request_id: str, at: float, usd: float) -> UsageRecord:
    return UsageRecord(
        request_id=request_id, tenant="acme", model="m", worker_id=None, prompt_tokens=1, completion_tokens=1,
        cost_usd=usd, status="ok", at=at,
    )  # fmt: skip


NEW_YEAR = _at(2027, 1, 1)
"""A new day and a new month, not a new week (the week began on Monday 2026-12-28)."""


async def test_the_store_bills_each_record_to_the_periods_holding_it(harness: StoreHarness) -> None:
    store = harness.store
    before, after = _record("r1", NEW_YEAR - 1.0, 0.25), _record("r2", NEW_YEAR + 1.0, 0.5)
    await store.append_usage_many([before, after])
    await store.append_usage_many([before, after])  # a replay bills nothing twice
    spent = {}
    for period in ("total", "daily", "weekly", "monthly"):
        keys = budget_key("acme", period, before.at), budget_key("acme", period, after.at)
        spent[period] = (await store.spent(keys[0]), await store.spent(keys[1]))
    assert spent["total"] == (0.75, 0.75)
    assert spent["weekly"] == (0.75, 0.75)
    assert spent["daily"] == (0.25, 0.5)
    assert spent["monthly"] == (0.25, 0.5)


async def test_the_memory_store_forgets_a_period_counter_after_its_expiry() -> None:
    """Redis expires its keys itself (next test)."""
    store = MemoryStore()
    await store.append_usage(_record("r1", _at(2026, 12, 2, 12), 1.0))
    await store.append_usage(_record("r2", _at(2026, 12, 4, 0, 0, 1), 1.0))  # past the 2nd's expiry
    assert await store.spent("spend.daily.20261202:acme") == 0.0
    assert await store.spent("spend.daily.20261204:acme") == 1.0
    assert await store.spent("spend.monthly.20261201:acme") == 2.0
    assert await store.spent("spend:acme") == 2.0


@pytest.mark.redis
async def test_redis_gives_each_period_counter_its_time_to_live(redis_url: str, key_prefix: str) -> None:
    """TTLs are relative to the record's ``at`` (Redis's clock need not be the caller's): a record of 2026-12-02
    12:00 leaves its daily counter 36 h, its weekly one 11.5 days, its monthly one 29.5 + 31 days."""
    store = RedisStore.from_url(redis_url, prefix=key_prefix, server_clock=False)
    raw = Redis.from_url(redis_url)
    try:
        await store.append_usage(_record("r1", _at(2026, 12, 2, 12), 1.0))
        layout = KeyLayout(key_prefix)
        names = ("spend:acme", "spend.daily.20261202:acme", "spend.weekly.20261130:acme", "spend.monthly.20261201:acme")
        ttl_s = {key: await raw.pttl(layout.limit(key)) / 1000 for key in names}
    finally:
        await raw.aclose()
        await store.close()
    assert ttl_s["spend:acme"] == -0.001  # no expiry
    assert 36 * 3600 - 60 < ttl_s["spend.daily.20261202:acme"] <= 36 * 3600
    assert 11.5 * 86400 - 60 < ttl_s["spend.weekly.20261130:acme"] <= 11.5 * 86400
    assert 60.5 * 86400 - 60 < ttl_s["spend.monthly.20261201:acme"] <= 60.5 * 86400
