"""Budget periods: which spend counter a budget is checked against, and which counters the ledger bills (issue 27).

A tenant's budget is either for all time (``total``: the counter ``spend:<tenant>``, as before periods existed) or
for a calendar period in UTC: ``daily`` (from 00:00), ``weekly`` (from Monday 00:00, ISO weeks) or ``monthly``
(from the 1st, 00:00). Each period has its own counter, named by the period's first day
(``spend.monthly.20261201:<tenant>``), so the reset lives in the store and needs no job: from the period's first
instant every replica's admission names the new counter, which no record has billed yet.

The store bills each record's cost to the lifetime counter and to the counter of every period that holds the
record's ``at`` (when the request finished: a request that straddles a reset is spent in the new period), whatever
the tenant's period is, so changing a tenant's period takes effect at once with the spend of the period so far.
A period's counter expires one period after the period ends (``BilledCounter.expire_at``): state stays bounded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Literal, get_args

BudgetPeriod = Literal["total", "daily", "weekly", "monthly"]
PERIODS: tuple[BudgetPeriod, ...] = ("daily", "weekly", "monthly")
"""The periods with a reset (``total`` has none)."""
_DAY_S = 86400.0


@dataclass(frozen=True, slots=True)
class PeriodSpan:
    """The period of ``period`` that holds an instant: ``[start, end)`` in Unix seconds (``total``: all time)."""

    period: BudgetPeriod
    start: float
    end: float

    @property
    def resets(self) -> bool:
        return math.isfinite(self.end)


@dataclass(frozen=True, slots=True)
class BilledCounter:
    """A spend counter one record is billed to, and when (Unix s) the store may drop it (None: never)."""

    key: str
    expire_at: float | None


def period_span(period: BudgetPeriod, at: float) -> PeriodSpan:
    """The ``period`` holding ``at`` (Unix seconds, UTC calendar)."""
    if period == "total":
        return PeriodSpan(period, -math.inf, math.inf)
    day = math.floor(at / _DAY_S)
    if period == "daily":
        return PeriodSpan(period, day * _DAY_S, (day + 1) * _DAY_S)
    if period == "weekly":
        monday = day - (day + 3) % 7  # 1970-01-01 was a Thursday
        return PeriodSpan(period, monday * _DAY_S, (monday + 7) * _DAY_S)
    if period == "monthly":
        first = datetime.fromtimestamp(day * _DAY_S, UTC).replace(day=1)
        following = (first + timedelta(days=32)).replace(day=1)
        return PeriodSpan(period, first.timestamp(), following.timestamp())
    raise ValueError(f"unknown budget period {period!r}; known: {list(get_args(BudgetPeriod))}")


def budget_key(tenant: str, period: BudgetPeriod, at: float) -> str:
    """The limit name of ``tenant``'s spend counter for the ``period`` holding ``at``."""
    if period == "total":
        return f"spend:{tenant}"
    start = datetime.fromtimestamp(period_span(period, at).start, UTC)
    return f"spend.{period}.{start:%Y%m%d}:{tenant}"


def billed_counters(tenant: str, at: float) -> tuple[BilledCounter, ...]:
    """Every counter a record of ``tenant`` finished at ``at`` is billed to: the lifetime one, then one per period."""
    return _billed_on_day(tenant, math.floor(at / _DAY_S))


@lru_cache(maxsize=4096)
def _billed_on_day(tenant: str, day: int) -> tuple[BilledCounter, ...]:
    """``billed_counters`` of any instant of ``day`` (days since 1970-01-01): every period starts at a midnight."""
    at = day * _DAY_S
    counters = [BilledCounter(budget_key(tenant, "total", at), None)]
    for period in PERIODS:
        span = period_span(period, at)
        counters.append(BilledCounter(budget_key(tenant, period, at), span.end + (span.end - span.start)))
    return tuple(counters)


def is_spend_key(key: str) -> bool:
    """True for a spend counter's limit name, lifetime or period (``spend:acme``, ``spend.daily.20261202:acme``)."""
    kind = key.partition(":")[0]
    return kind == "spend" or kind.startswith("spend.")


def counter_series(key: str) -> str:
    """A spend counter's name without its period's first day (``spend.daily.20261202:acme`` → ``spend.daily:acme``):
    the same for every period of one tenant and one kind of period (a lifetime counter is its own series)."""
    kind, _, scope = key.partition(":")
    return f"{kind.rsplit('.', 1)[0] if kind.count('.') == 2 else kind}:{scope}"
