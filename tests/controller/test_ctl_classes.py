"""Workload classes inferred from the shape of the per-position acceptance (``controller.classes``)."""

from __future__ import annotations

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
