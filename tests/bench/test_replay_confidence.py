"""The replay check's confidence intervals (``bench.replay.confidence``): order-statistic intervals for quantiles,
a compound Poisson interval for throughput, and a verdict that does not judge a p99 of a handful of samples as if
it were exact."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest

from bench.replay.check import CheckConfig, CheckResult, Comparison, TierFigures, measured_figures
from bench.replay.confidence import (
    Interval,
    binomial_cdfs,
    error_interval,
    quantile_interval,
    quantile_ranks,
    rate_interval,
    verdict,
)
from bench.replay.report import render_check
from fleet.store.protocol import UsageRecord


def test_binomial_cdfs_are_the_binomial_sums() -> None:
    for n, p in ((10, 0.5), (37, 0.9), (5, 0.01)):
        direct = [sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1)) for k in range(n + 1)]
        assert binomial_cdfs(n, p) == pytest.approx(direct, abs=1e-12)


def test_the_median_of_100_samples_lies_between_the_40th_and_61st() -> None:
    """The textbook ranks (Conover, table A3: n = 100, 95 %)."""
    assert quantile_ranks(100, 0.5) == (40, 61)


def test_a_p99_has_no_upper_bound_below_about_370_samples() -> None:
    """P(all n samples below the p99) = 0.99ⁿ must reach 2.5 % for the largest sample to bound it: n ≥ 368."""
    assert quantile_ranks(200, 0.99)[1] is None
    assert quantile_ranks(367, 0.99)[1] is None
    assert quantile_ranks(368, 0.99)[1] == 368
    lo, hi = quantile_ranks(2000, 0.99)
    assert lo is not None
    assert hi is not None
    assert lo < 1980 < hi <= 2000


@pytest.mark.parametrize(("n", "q"), [(50, 0.5), (200, 0.99), (2000, 0.99)])
def test_the_quantile_interval_covers_the_true_quantile_at_least_95_percent_of_the_time(n: int, q: float) -> None:
    rng = random.Random(7)
    truth = -math.log(1 - q)  # the exponential(1) quantile
    trials = 300
    covered = 0
    for _ in range(trials):
        ci = quantile_interval([rng.expovariate(1.0) for _ in range(n)], q)
        covered += ci.lo <= truth <= ci.hi
    assert covered / trials >= 0.93


def test_the_rate_interval_covers_a_poisson_streams_rate() -> None:
    rng = random.Random(11)
    rate, window_s, mean_tokens = 3.0, 60.0, 80.0
    covered = 0
    for _ in range(300):
        arrivals, t = [], rng.expovariate(rate)
        while t < window_s:
            arrivals.append(float(rng.randint(16, 2 * int(mean_tokens) - 16)))
            t += rng.expovariate(rate)
        ci = rate_interval(arrivals, window_s)
        covered += ci.lo <= rate * mean_tokens <= ci.hi
    assert covered / 300 >= 0.92


def test_error_interval_and_verdict() -> None:
    spread = error_interval(1.2, Interval(1.0, 1.5))
    assert (spread.lo, spread.hi) == pytest.approx((1.2 / 1.5 - 1, 0.2))
    assert error_interval(1.0, Interval(0.0, math.inf)) == Interval(-1.0, math.inf)
    assert verdict(0.1, Interval(0.0, 0.2), 0.15) == "within"
    assert verdict(0.42, Interval(-1.0, 0.6), 0.15) == "within its CI"
    assert verdict(0.42, Interval(0.2, 0.6), 0.15) == "miss"
    assert verdict(-0.3, Interval(-0.4, -0.16), 0.15) == "miss"


def _ledger(ttfts: Sequence[float], *, start: float = 1000.0) -> list[UsageRecord]:
    return [
        UsageRecord(
            request_id=f"r{i}", tenant="demo", model="m", worker_id="w0", prompt_tokens=100, completion_tokens=50,
            cost_usd=0.0, status="ok", ttft_s=ttft, tpot_s=0.01, at=start + 1.0 + i * 0.01,
            arrived_at=start + 0.5 + i * 0.01, tier="interactive",
        )
        for i, ttft in enumerate(ttfts)
    ]  # fmt: skip


def _judged_p99(n: int, over: float) -> str:
    """The verdict on a predicted TTFT p99 ``over`` above a measured one from ``n`` samples."""
    rng = random.Random(n)
    measured = measured_figures(_ledger([rng.expovariate(10.0) for _ in range(n)]), start=1000.0, window_s=600.0)
    tier = measured["interactive"]
    predicted = TierFigures(
        tier.throughput_tok_s, tier.ttft_p50_s, tier.ttft_p99_s * (1 + over), tier.tpot_p50_s, tier.tpot_p99_s, n
    )
    return Comparison("gearshift", measured, {"interactive": predicted}, n).judge("interactive", "ttft_p99_s").verdict


def test_a_p99_42_percent_slow_is_within_its_ci_on_200_samples_and_a_miss_on_5000() -> None:
    """The 60-s check's worst figure (interactive TTFT p99 +42 %, ~200 requests a tier) cannot be judged from 200
    samples; the same error from the ≥ 2 000 a tier of issue 29's longer recording (5 000 here) is a miss."""
    assert _judged_p99(200, 0.42) == "within its CI"
    assert _judged_p99(5000, 0.42) == "miss"
    assert _judged_p99(5000, 0.05) == "within"


def test_measured_figures_carry_an_interval_and_sample_count_for_every_metric() -> None:
    tier = measured_figures(_ledger([0.05 + 0.001 * i for i in range(100)]), start=1000.0, window_s=600.0)
    figures = tier["interactive"]
    assert set(figures.intervals) == set(figures.samples) == {
        "throughput_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
    }  # fmt: skip
    assert figures.samples["ttft_p99_s"] == 100
    p50 = figures.intervals["ttft_p50_s"]
    assert (p50.lo, p50.hi) == pytest.approx((0.05 + 0.039, 0.05 + 0.060)), "ranks 40 and 61"
    assert figures.intervals["ttft_p99_s"].hi == math.inf
    rate = figures.intervals["throughput_tok_s"]
    assert rate.lo < figures.throughput_tok_s < rate.hi


def test_the_report_shows_each_figures_interval_and_counts_the_verdicts() -> None:
    measured = measured_figures(_ledger([0.05 + 0.001 * i for i in range(100)]), start=1000.0, window_s=600.0)
    m = measured["interactive"]
    predicted = TierFigures(m.throughput_tok_s, m.ttft_p50_s, m.ttft_p99_s * 1.4, m.tpot_p50_s, m.tpot_p99_s, 100)
    result = CheckResult(CheckConfig(), [Comparison("k=7", measured, {"interactive": predicted}, 100)])
    text = render_check(result, command="gearshift bench replay-check")
    assert "## k=7 (100 requests): 4 within 15 %, 1 more within their CI, 0 missed" in text
    assert "| interactive | ttft_p99_s | 100 |" in text
    assert "within its CI" in text
    assert "∞]" in text
