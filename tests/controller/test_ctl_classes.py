"""Workload classes inferred from the shape of the per-position acceptance (``controller.classes``)."""

from __future__ import annotations

import itertools
import random

import pytest

from controller.classes import fit_mix, slowest_al_ratio, unconditional
from fleet.perf import Profile, conditional_acceptance

CONTEXT = 2000.0


def observed(profile: Profile, shares: dict[str, float], k: int = 8) -> list[tuple[float, float]]:
    """Per-position ``(a_i, drafts)`` of a worker whose request-steps split ``shares`` over the classes."""
    curves = {c: unconditional(conditional_acceptance(profile, c, CONTEXT)) for c in shares}
    return [(sum(s * curves[c][i] for c, s in shares.items()), 1000.0) for i in range(k)]


def test_a_two_class_mix_is_recovered(lab_profile: Profile) -> None:
    mix = dict(fit_mix(lab_profile, observed(lab_profile, {"chat": 0.4, "maths": 0.6}), CONTEXT))
    assert set(mix) == {"chat", "maths"}
    assert mix["maths"] == pytest.approx(0.6, abs=0.05)
    assert sum(mix.values()) == pytest.approx(1.0)


def test_a_single_class_is_one_class(lab_profile: Profile) -> None:
    assert fit_mix(lab_profile, observed(lab_profile, {"code": 1.0}), CONTEXT) == (("code", 1.0),)
    assert fit_mix(lab_profile, [], CONTEXT) == ()


def test_the_slowest_material_class_sets_the_ratio(lab_profile: Profile) -> None:
    mix = (("maths", 0.5), ("chat", 0.5))
    ratio = slowest_al_ratio(lab_profile, mix, 8, CONTEXT, min_share=0.1)
    assert 0 < ratio < 1  # chat's accepted length is below the blend's
    assert slowest_al_ratio(lab_profile, mix, 0, CONTEXT, min_share=0.1) == pytest.approx(1.0)  # no drafts
    assert slowest_al_ratio(lab_profile, (("maths", 0.95), ("chat", 0.05)), 8, CONTEXT, min_share=0.1) == 1.0
    assert slowest_al_ratio(lab_profile, (("maths", 1.0),), 8, CONTEXT, min_share=0.1) == 1.0


def _every_pair_on_the_grid(profile: Profile, obs: list[tuple[float, float]]) -> tuple[tuple[str, float], ...]:
    """``fit_mix`` without skipping any pair: the grid searched in full, in the same order, with the same sums."""
    priors = {c: unconditional(conditional_acceptance(profile, c, CONTEXT)) for c in profile.acceptance}
    best: tuple[float, tuple[tuple[str, float], ...]] | None = None
    for c1, c2 in itertools.combinations_with_replacement(sorted(priors), 2):
        for step in range(21):
            w = step / 20
            err = sum(
                d * (a - (w * p1 + (1 - w) * p2)) ** 2
                for (a, d), p1, p2 in zip(obs, priors[c1], priors[c2], strict=False)
            )
            if best is None or err < best[0] - 1e-12:
                best = (err, ((c1, 1.0),) if c1 == c2 else ((c1, w), (c2, 1 - w)))
    assert best is not None
    return tuple(sorted({c: s for c, s in best[1] if s > 0}.items(), key=lambda cs: -cs[1]))


def test_skipping_hopeless_pairs_never_changes_the_fit(lab_profile: Profile) -> None:
    rng = random.Random(5)
    cases = [[(rng.random(), float(rng.randint(0, 900))) for _ in range(rng.randint(1, 8))] for _ in range(150)]
    classes = sorted(lab_profile.acceptance)
    for _ in range(50):  # exact grid mixes of two classes: near-ties between pairs and weights
        c1, c2 = rng.sample(classes, 2)
        w = rng.randint(0, 20) / 20
        cases.append(observed(lab_profile, {c1: w, c2: 1 - w}, k=rng.randint(1, 8)))
    for obs in cases:
        assert fit_mix(lab_profile, obs, CONTEXT) == _every_pair_on_the_grid(lab_profile, obs)
