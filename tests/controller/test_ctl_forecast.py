"""The per-class load forecast (controller.forecast): level, trend, daily profile, error band."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from controller.forecast import DAY_S, ForecastConfig, forecast
from fleet.store.protocol import UsageRecord

NOW = 1_800_000_000.0
CFG = ForecastConfig(window_s=60.0, windows=10)


def arrivals(rate: Callable[[float], float], start: float, end: float, *, seed: int, tier: str = "interactive",
             workload: str | None = "chat") -> list[UsageRecord]:  # fmt: skip
    """A Poisson trace of rate ``rate(t)`` req/s (thinned from its maximum over the span)."""
    rng = random.Random(seed)
    peak = max(rate(start + i * (end - start) / 200) for i in range(201))
    out: list[UsageRecord] = []
    t = start
    while True:
        t += rng.expovariate(peak)
        if t >= end:
            return out
        if rng.random() < rate(t) / peak:
            out.append(UsageRecord(request_id=f"r{len(out)}", tenant="t", model="m", worker_id="w0",
                                   prompt_tokens=500, completion_tokens=200, cost_usd=0.0, status="ok",
                                   at=t + 5.0, arrived_at=t, tier=tier, workload=workload))  # fmt: skip


def test_a_steady_class_is_forecast_at_its_rate_within_the_band() -> None:
    recs = arrivals(lambda t: 3.0, NOW - 900, NOW, seed=1)
    f = forecast(recs, now=NOW, horizon_s=300, config=CFG)["interactive/chat"]
    assert abs(f.rate_rps - 3.0) <= f.band_rps
    assert f.upper_rps > f.rate_rps
    assert not f.daily
    assert (f.prompt_tokens, f.output_tokens) == (500, 200)


def test_a_ramp_is_extrapolated_along_its_trend() -> None:
    ramp = lambda t: 1.0 + 4.0 * (t - (NOW - 600)) / 600  # noqa: E731  1 → 5 req/s over the last ten minutes
    f = forecast(arrivals(ramp, NOW - 600, NOW, seed=2), now=NOW, horizon_s=120, config=CFG)["interactive/chat"]
    assert f.trend_rps_per_s > 0
    assert f.rate_rps > f.level_rps
    assert abs(f.rate_rps - ramp(NOW + 120)) <= f.band_rps


def test_a_day_of_history_forecasts_yesterdays_surge_before_it_arrives() -> None:
    surge_at = NOW + 300  # yesterday the load tripled at this time of day; today it has not yet

    def daily(t: float) -> float:
        return 6.0 if (t - surge_at) % DAY_S < 1800 else 2.0

    yesterday = arrivals(daily, NOW - DAY_S - 600, NOW - DAY_S + 1200, seed=3)  # the ledger around this hour
    recs = yesterday + arrivals(daily, NOW - 900, NOW, seed=7)
    f = forecast(recs, now=NOW, horizon_s=600, config=CFG)["interactive/chat"]
    assert f.daily
    assert f.level_rps == pytest.approx(2.0, abs=0.5)
    assert abs(f.rate_rps - 6.0) <= f.band_rps
    without = forecast(recs[len(yesterday) :], now=NOW, horizon_s=600, config=CFG)["interactive/chat"]
    assert without.upper_rps < 6.0, "without the day, nothing announces the surge"


def test_classes_apart_and_no_records_no_forecast() -> None:
    recs = arrivals(lambda t: 2.0, NOW - 600, NOW, seed=4) + arrivals(
        lambda t: 0.5, NOW - 600, NOW, seed=5, tier="batch", workload=None
    )
    out = forecast(recs, now=NOW, horizon_s=60, config=CFG)
    assert set(out) == {"interactive/chat", "batch/default"}
    assert out["batch/default"].rate_rps < out["interactive/chat"].rate_rps
    assert forecast([], now=NOW, horizon_s=60) == {}


def test_pure() -> None:
    recs = arrivals(lambda t: 1.5, NOW - 600, NOW, seed=6)
    assert forecast(recs, now=NOW, horizon_s=60) == forecast(list(reversed(recs)), now=NOW, horizon_s=60)


def test_a_ledger_younger_than_the_span_reads_no_rise_from_before_its_start() -> None:
    """Issue 25: the windows before the ledger's first record are unknown, not empty: a steady class three
    windows old is forecast at its rate, not extrapolated along the rise from the zeros before it over the
    horizon (1.6 req/s measured read as 2.9 forecast in the lab's first plan)."""
    recs = arrivals(lambda t: 3.0, NOW - 200, NOW, seed=4)
    f = forecast(recs, now=NOW, horizon_s=600, config=CFG)["interactive/chat"]
    assert abs(f.rate_rps - 3.0) <= f.band_rps
    assert abs(f.trend_rps_per_s * 600) < f.band_rps
    fifth = recs[4].arrived_at or NOW
    young = forecast(recs[:5], now=fifth + 1.0, horizon_s=600, config=CFG)["interactive/chat"]
    assert young.trend_rps_per_s == 0.0, "less than a window of history: its rate so far, no trend"
