"""Unit tests of the fit and the acceptance estimate (no server)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from bench.profiler.fit import fit_step_time, fitted_profile, measured_acceptance, nonnegative_lstsq, shape_of
from bench.profiler.sweep import Point
from fleet.perf import Profile, load_profile, step_time
from fleet.scrape import WorkerScrape

BASE = load_profile("kimi-k3-dspark-tp16")


def synthetic_point(profile: Profile, batch: int, k: int, context: float = 500.0, **window: Any) -> Point:
    point = Point(batch, k, 0.0, 10, float(batch), context, WorkerScrape(**window))
    t = step_time(profile, shape_of(point)).total_s
    return Point(batch, k, t, 10, float(batch), context, point.window)


def test_nonnegative_lstsq_drops_a_column_that_would_go_negative() -> None:
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    y = np.array([3.0, 2.0, 1.0])  # unconstrained: slope −1
    coef = nonnegative_lstsq(a, y)
    assert coef[1] == 0.0
    assert coef[0] == pytest.approx(2.0)


def test_a_profile_with_other_costs_is_recovered_from_its_own_step_times() -> None:
    other = BASE.model_copy(
        update={
            "target": BASE.target.model_copy(
                update={"step_overhead_s": 2e-3, "comm_s_per_token": 3e-4, "state_bytes_per_seq": 0.0}
            ),
            "drafter": BASE.drafter.model_copy(update={"fixed_s": 4e-3, "per_position_s": 5e-5}),
        }
    )
    points = [synthetic_point(other, b, k, 500.0 + 50.0 * b) for b in (1, 4, 16) for k in (0, 2, 8)]
    fit = fitted_profile(BASE, points, name="other", k_max=8)
    for b in (2, 8, 32):  # also between and beyond the grid
        for k in (1, 4):
            shape = shape_of(synthetic_point(other, b, k))
            assert step_time(fit.profile, shape).total_s == pytest.approx(step_time(other, shape).total_s, rel=1e-6)
    assert fit.profile.target.comm_s_per_token == pytest.approx(3e-4, rel=1e-6)
    assert fit.profile.drafter.fixed_s == pytest.approx(4e-3, rel=1e-6)


def test_too_few_points_is_an_error_naming_the_points() -> None:
    with pytest.raises(ValueError, match="points: need at least 7"):
        fit_step_time(BASE, [synthetic_point(BASE, 1, 0)])


def test_acceptance_is_made_conditional_per_position_at_the_largest_k() -> None:
    points = [
        synthetic_point(BASE, 4, 2, drafts=100.0, accepted_per_pos=(80.0, 40.0)),
        synthetic_point(BASE, 4, 1, drafts=100.0, accepted_per_pos=(10.0,)),
    ]
    accepted = measured_acceptance(points)
    assert accepted is not None
    assert accepted.base == (0.8, 0.5)
    assert measured_acceptance([synthetic_point(BASE, 4, 0)]) is None
