"""The profiler against a simulated worker: the fitted profile reproduces the simulator's own step-time curve
(fleet.perf.step_time with the profile the simulator runs) over the whole swept (B, k) grid."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.profiler.fit import shape_of
from bench.profiler.output import render
from bench.profiler.run import profile_worker
from bench.profiler.sweep import Point, SweepConfig
from fleet.perf import conditional_acceptance, load_profile, step_time
from workers.sim.server import SimServer

from .conftest import CONTROL_TOKEN

pytestmark = pytest.mark.timeout(90)

GRID = SweepConfig(batch_sizes=(1, 2, 4, 8, 16, 32), ks=(0, 1, 2, 4, 7), window_steps=30, poll_s=0.01)
TOLERANCE = 0.10


def relative_error(fitted: float, truth: float) -> float:
    return abs(fitted / truth - 1.0)


async def test_the_fit_recovers_the_simulators_step_time_curve_within_10_percent(
    sim_worker: SimServer, tmp_path: Path
) -> None:
    truth = sim_worker.settings.load_profile()
    seen: list[Point] = []
    fit = await profile_worker(
        sim_worker.url, GRID, base=truth, control_token=CONTROL_TOKEN, name="recovered", progress=seen.append
    )
    assert [(p.batch_size, p.k) for p in seen] == [(b, k) for k in GRID.ks for b in GRID.batch_sizes]

    errors = {
        (p.batch_size, p.k): relative_error(
            step_time(fit.profile, shape_of(p)).total_s, step_time(truth, shape_of(p)).total_s
        )
        for p in fit.points
    }
    assert max(errors.values()) < TOLERANCE, errors
    # The measurement itself, not only the fit, follows the simulator's curve.
    assert all(relative_error(p.step_s, step_time(truth, shape_of(p)).total_s) < TOLERANCE for p in fit.points)

    # Acceptance at the largest k: the simulator's chat class, conditional per position.
    expected = conditional_acceptance(truth, "chat", fit.points[-1].context_tokens)
    measured = fit.profile.acceptance["measured"].base
    assert len(measured) == max(GRID.ks)
    assert all(abs(m - e) < 0.1 for m, e in zip(measured[:4], expected[:4], strict=True)), (measured, expected)

    # The sweep left the worker on its start-up schedule.
    state = sim_worker.worker.control.state()
    assert state.schedule == state.fallback_schedule

    # The written YAML loads as a profile and documents every point.
    path = tmp_path / "recovered.yaml"
    path.write_text(render(fit, worker_url=sim_worker.url, base_name=truth.name, config=GRID))
    assert load_profile(path) == fit.profile
    header = [line for line in path.read_text().splitlines() if line.startswith("#")]
    assert len([line for line in header if line.startswith("#   ") and line.split()[1].isdigit()]) == len(seen)
