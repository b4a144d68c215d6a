"""Why the one-node B300 profile's best k rises with concurrency while InferenceX's falls, in the profile's own
numbers (the profile's header and docs/guide/simulator.md state the same): the roofline's step time is concave in
the tokens a step verifies (the distinct experts E·(1 − (1 − r/E)^n) saturate), so a verified token costs less the
more tokens a step carries; InferenceX's schedule is the largest k with concurrency × (k + 1) ≤ 64 and needs a
verified token to cost several times more above 64 tokens per step than below."""

from __future__ import annotations

from itertools import pairwise

import pytest

from fleet.perf import Profile, StepShape, conditional_acceptance, expected_tokens_per_step, load_profile, step_time
from workers.sim.figure_files import BenchmarkFigures, BestKFigure, figures_path, load_figures_file

NODE = load_profile("kimi-k3-dspark-b300-tp8")


def _figure() -> BestKFigure:
    figures = load_figures_file(figures_path(NODE))
    assert isinstance(figures, BenchmarkFigures)
    (fig,) = [f for f in figures.figures if isinstance(f, BestKFigure)]
    return fig


FIG = _figure()
CONTEXT = FIG.workload.input_tokens + FIG.workload.output_tokens // 2
"""A decoding sequence's mean context over its answer, tokens."""


def _step_s(profile: Profile, c: int, k: int) -> float:
    return step_time(profile, StepShape(c, k, c * CONTEXT, drafter_loaded=k > 0)).total_s


def _tokens(profile: Profile, k: int) -> float:
    return expected_tokens_per_step(conditional_acceptance(profile, FIG.workload.acceptance_class, CONTEXT), k)


def _best(profile: Profile, c: int) -> int:
    rate = {k: c * _tokens(profile, k) / _step_s(profile, c, k) for k in FIG.candidates}
    return max(rate, key=lambda k: (rate[k], -k))


def _break_even_s_per_token(profile: Profile, c: int, lo: int, hi: int) -> float:
    """What each of the c·(hi − lo) more verified tokens of a step at k = hi may cost over the step at k = lo for
    both to give the same throughput, seconds."""
    t_lo = _step_s(profile, c, lo)
    return t_lo * (_tokens(profile, hi) / _tokens(profile, lo) - 1.0) / (c * (hi - lo))


def _model_s_per_token(profile: Profile, c: int, lo: int, hi: int) -> float:
    return (_step_s(profile, c, hi) - _step_s(profile, c, lo)) / (c * (hi - lo))


def test_inferencex_picks_the_largest_k_that_keeps_a_step_within_64_verified_tokens() -> None:
    for p in FIG.points:
        fits = [k for k in FIG.candidates if p.concurrency * (k + 1) <= 64]
        assert p.k == max(fits), f"c={p.concurrency}"


def test_the_profile_charges_a_verified_token_less_the_more_tokens_its_step_carries() -> None:
    """Extra draft tokens at concurrency c: the step's added time per added token falls as c rises."""
    per_token = [_model_s_per_token(NODE, c, 0, 3) for c in (1, 4, 8, 16, 32)]
    assert all(a > b for a, b in pairwise(per_token)), per_token


def test_so_its_best_k_never_falls_with_concurrency() -> None:
    ks = [_best(NODE, p.concurrency) for p in FIG.points]
    assert ks == sorted(ks), ks


def test_inferencex_needs_verified_tokens_past_64_per_step_to_cost_far_more_than_those_below() -> None:
    """k = 7 over k = 4 at c = 8 (40 → 64 tokens) only if each added token costs at most ``below``; k = 0 over
    k = 3 at c = 32 (32 → 128 tokens) only if each costs at least ``above``. The roofline charges neither."""
    below = _break_even_s_per_token(NODE, 8, 4, 7)
    above = _break_even_s_per_token(NODE, 32, 0, 3)
    assert above > 2.5 * below
    assert _model_s_per_token(NODE, 8, 4, 7) > below, "the profile charges more than k = 7 at c = 8 allows"
    assert _model_s_per_token(NODE, 32, 0, 3) < above, "and less than k = 0 at c = 32 needs"


@pytest.mark.parametrize("verify_ms", [0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0])
def test_no_verify_cost_per_token_reproduces_the_schedule(verify_ms: float) -> None:
    """A cost per verified token that plain decode does not pay (the MI355X fit's term) is linear in the tokens, so
    it moves every concurrency's best k the same way and cannot make it fall from 7 to 0."""
    target = NODE.target.model_copy(update={"verify_s_per_token": verify_ms * 1e-3})
    costly = NODE.model_copy(update={"target": target})
    ks = [_best(costly, p.concurrency) for p in FIG.points]
    assert ks != [p.k for p in FIG.points]
    assert ks[0] != 7 or ks[-1] != 0, ks
