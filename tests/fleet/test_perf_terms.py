"""``step_time`` keeps per-profile terms (compute per token, distinct experts by token count) between calls: the
same floats as computing them afresh, and never another profile's, also for a copy with changed values."""

from __future__ import annotations

import itertools

from fleet import perf
from fleet.perf import StepShape, conditional_acceptance, load_profile, step_time

SHAPES = [
    StepShape(b, k, b * ctx, prefill, loaded)
    for b, k, ctx, prefill, loaded in itertools.product((0, 1, 7, 32), (0, 3, 7), (0, 1500), (0, 512), (False, True))
]


def test_kept_terms_give_the_floats_of_a_fresh_computation() -> None:
    profile = load_profile("kimi-k3-dspark-b300-tp8")
    kept = [step_time(profile, s) for s in SHAPES]
    again = [step_time(profile, s) for s in SHAPES]
    fresh = []
    for s in SHAPES:
        perf._TERMS.clear()
        fresh.append(step_time(profile, s))
    assert kept == again == fresh


def test_a_copy_with_other_experts_or_compute_gets_its_own_terms() -> None:
    profile = load_profile("kimi-k3-dspark-tp16")
    shape = StepShape(16, 4, 16 * 2000, 0, True)
    before = step_time(profile, shape)
    fewer = profile.model_copy(update={"target": profile.target.model_copy(update={"num_experts": 64})})
    slower = profile.model_copy(
        update={"hardware": profile.hardware.model_copy(update={"flops_per_s": profile.hardware.flops_per_s / 500})}
    )
    for other in (fewer, slower):
        got = step_time(other, shape)
        perf._TERMS.clear()
        assert got == step_time(other, shape)
        assert got != before
    assert step_time(profile, shape) == before


def test_kept_acceptance_is_a_fresh_computation_and_never_another_profiles() -> None:
    """``conditional_acceptance`` keeps what it computed per profile: the same floats as afresh, for int and float
    contexts alike, and a copy with another acceptance gets its own."""
    profile = load_profile("kimi-k3-dspark-tp16")
    asks = [(w, c) for w in (*profile.acceptance, "unknown-workload") for c in (0, 1, 700, 700.0, 2250.5, 150_000)]
    kept = [conditional_acceptance(profile, w, c) for w, c in asks]
    again = [conditional_acceptance(profile, w, c) for w, c in asks]
    fresh = []
    for w, c in asks:
        perf._TERMS.clear()
        fresh.append(conditional_acceptance(profile, w, c))
    assert kept == again == fresh
    name = profile.default_workload
    cls = profile.acceptance[name]
    halved = cls.model_copy(update={"base": tuple(p / 2 for p in cls.base)})
    other = profile.model_copy(update={"acceptance": {**profile.acceptance, name: halved}})
    before = conditional_acceptance(profile, name, 700)
    assert conditional_acceptance(other, name, 700) != before
    assert conditional_acceptance(profile, name, 700) == before
