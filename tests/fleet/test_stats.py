"""The one percentile: numpy's default ("linear", Hyndman & Fan type 7), in pure Python."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.stats import percentile

finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False)


@given(st.lists(finite, min_size=1, max_size=50), st.floats(min_value=0.0, max_value=1.0))
def test_matches_numpys_default_method(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.quantile(values, q, method="linear")), rel=1e-9, abs=1e-9)


@given(st.lists(finite, min_size=2, max_size=50))
def test_matches_statistics_inclusive_at_every_percent(values: list[float]) -> None:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    assert [percentile(values, i / 100) for i in range(1, 100)] == pytest.approx(cuts, rel=1e-9, abs=1e-9)


def test_interpolates_between_closest_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0.0) == 1.0
    assert percentile(values, 0.5) == 2.5
    assert percentile(values, 0.99) == pytest.approx(3.97)
    assert percentile(values, 1.0) == 4.0


def test_nan_values_are_left_out_and_no_values_give_nan() -> None:
    assert percentile([math.nan, 2.0, 4.0], 0.5) == 3.0
    assert math.isnan(percentile([], 0.5))
    assert math.isnan(percentile([math.nan], 0.5))


@pytest.mark.parametrize("q", [-0.01, 1.01, 99.0])
def test_q_outside_zero_to_one_is_an_error(q: float) -> None:
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], q)
