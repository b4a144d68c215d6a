"""The load forecast per traffic class, from the ledger (issue 25): what the fleet plan is sized for.

Pure: ``forecast(records, now=…, horizon_s=…)`` reads finished requests (``UsageRecord``: arrival time, tier,
workload hint, prompt and output tokens) and the injected time ``now`` (Unix seconds); no clock, no store.

Per class (``fleet.plan.traffic_class``), over the last ``windows`` windows of ``window_s`` seconds:

- **level and trend**: a least-squares line through the windows' arrival rates (requests/s), read at ``now``
  (level) and as its slope (trend, requests/s per second); only the windows after the ledger's first record
  count: before it the load is unknown, not zero (counted as zero, a fleet's first minutes read as a steep
  rise, extrapolated over the restart horizon: 1.6 req/s measured, 2.9 forecast, 4.8 planned for); a slope
  within ``z`` standard errors of zero is no trend (the mean stands);
- **daily profile**, when the ledger reaches back a day: the change the same class showed yesterday between
  ``now`` and ``now + horizon_s`` is added to the level (a surge that came at 09:00 yesterday is expected at 09:00
  today, before it arrives); the trend is then not extrapolated, yesterday's shape stands in for it;
- **the error band**: ``z`` × the fit's residual spread plus the Poisson noise of the predicted rate over one
  window (√(rate / window_s)); ``upper_rps``, the band's upper edge, is what the planner plans for;
- **mean lengths**: prompt and output tokens of the class's requests in those windows.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fleet.plan import ClassForecast, TrafficClass, traffic_class
from fleet.store.protocol import UsageRecord

DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class ForecastConfig:
    window_s: float = 60.0
    """Length of one counting window, seconds."""
    windows: int = 10
    """Recent windows the level and trend are fitted on."""
    z: float = 2.0
    """Width of the error band in residual spreads (2: about 95 % for normal errors)."""


@dataclass(frozen=True, slots=True)
class Forecast:
    """One class's expected load ``horizon_s`` ahead of ``now``. Rates in requests per second."""

    cls: TrafficClass
    rate_rps: float
    """The expected arrival rate at the horizon."""
    band_rps: float
    """Half-width of the stated error band."""
    level_rps: float
    """The fitted rate now."""
    trend_rps_per_s: float
    prompt_tokens: float
    output_tokens: float
    daily: bool
    """A day of history shaped the forecast."""

    @property
    def upper_rps(self) -> float:
        """The band's upper edge: what the plan is sized for."""
        return self.rate_rps + self.band_rps

    def record(self) -> ClassForecast:
        """As the plan record stores it."""
        return ClassForecast(
            rate_rps=self.rate_rps,
            upper_rps=self.upper_rps,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
        )

    def text(self) -> str:
        source = "daily profile + level" if self.daily else f"level + trend {self.trend_rps_per_s * 60:+.3f}/s per min"
        return (
            f"{self.cls}: {self.rate_rps:.2f} ± {self.band_rps:.2f} req/s (plan for {self.upper_rps:.2f}; "
            f"now {self.level_rps:.2f}; {source}); prompt {self.prompt_tokens:.0f}, output {self.output_tokens:.0f} tok"
        )


def _arrival(r: UsageRecord) -> float:
    return r.arrived_at if r.arrived_at is not None else r.at


def _line(rates: Sequence[float], z: float, window_s: float) -> tuple[float, float, float]:
    """Least squares through ``rates`` at x = 0…n−1: (value at the last x, slope per step, residual spread). A
    slope within ``z`` of its own standard error (from the residuals, at least the windows' Poisson noise,
    √(rate / window_s)) is noise, not a trend: then the mean, no slope, and the spread about the mean (three
    noisy windows' slope, extrapolated over a restart's horizon, doubled a steady rate)."""
    n = len(rates)
    mean_x, mean_y = (n - 1) / 2, sum(rates) / n
    sxx = sum((x - mean_x) ** 2 for x in range(n))
    slope = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(rates)) / sxx if sxx > 0 else 0.0
    fitted = [mean_y + slope * (x - mean_x) for x in range(n)]
    spread = math.sqrt(sum((y - f) ** 2 for y, f in zip(rates, fitted, strict=True)) / max(n - 2, 1))
    noise = max(spread, math.sqrt(max(mean_y, 0.0) / window_s))
    if n < 3 or abs(slope) <= z * noise / math.sqrt(sxx):
        flat = math.sqrt(sum((y - mean_y) ** 2 for y in rates) / max(n - 1, 1))
        return mean_y, 0.0, flat
    return fitted[-1], slope, spread


def _rate(times: Sequence[float], start: float, end: float) -> float:
    return sum(1 for t in times if start <= t < end) / (end - start)


def forecast(
    records: Iterable[UsageRecord], *, now: float, horizon_s: float, config: ForecastConfig | None = None
) -> dict[TrafficClass, Forecast]:
    """Each class's forecast ``horizon_s`` seconds after ``now`` (Unix s), from the ledger's ``records``."""
    cfg = config or ForecastConfig()
    span = cfg.window_s * cfg.windows
    by_class: dict[TrafficClass, list[UsageRecord]] = defaultdict(list)
    for r in records:
        by_class[traffic_class(r.tier or "default", r.workload)].append(r)
    out: dict[TrafficClass, Forecast] = {}
    history = min((_arrival(r) for recs in by_class.values() for r in recs), default=now)
    for cls, recs in sorted(by_class.items()):
        times = [_arrival(r) for r in recs]
        recent = [r for r, t in zip(recs, times, strict=True) if now - span <= t < now]
        if not recent:
            continue
        starts = [s for i in range(cfg.windows) if (s := now - span + i * cfg.window_s) >= history]
        if starts:
            rates = [_rate(times, s, s + cfg.window_s) for s in starts]
            level, slope, spread = _line(rates, cfg.z, cfg.window_s)
        else:  # the ledger is younger than one window: its rate so far, no trend
            level, slope, spread = _rate(times, history, now) if now > history else 0.0, 0.0, 0.0
        trend = slope / cfg.window_s
        daily = min(times) <= now - DAY_S + cfg.window_s
        if daily:
            then = now - DAY_S
            change = _rate(times, then + horizon_s - cfg.window_s, then + horizon_s) - _rate(
                times, then - cfg.window_s, then
            )
            rate = max(level + change, 0.0)
        else:
            rate = max(level + trend * horizon_s, 0.0)
        band = cfg.z * spread + math.sqrt(rate / cfg.window_s)
        out[cls] = Forecast(
            cls=cls,
            rate_rps=rate,
            band_rps=band,
            level_rps=max(level, 0.0),
            trend_rps_per_s=trend,
            prompt_tokens=sum(r.prompt_tokens for r in recent) / len(recent),
            output_tokens=sum(r.completion_tokens for r in recent) / len(recent),
            daily=daily,
        )
    return out
