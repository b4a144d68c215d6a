"""Windows (counter deltas over constant k) and the estimator that smooths them."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from controller.estimator import EstimatorConfig, WorkerEstimator
from controller.window import Window, WindowBreak, window_between
from fleet.perf import Profile, conditional_acceptance, predict_step
from fleet.scrape import WorkerScrape

SCHEDULE4 = ((1, 256, 4),)


def scrape(at: float, **kw: Any) -> WorkerScrape:
    base = WorkerScrape(at_s=at, spec_version=3, spec_schedule=SCHEDULE4, running=8)
    return replace(base, **kw)


def test_window_deltas_and_derived_figures() -> None:
    prev = scrape(10.0, drafts=100, draft_tokens=400, accepted=200, accepted_per_pos=(90, 60, 35, 15), steps=20,
                  generation_tokens=300, prompt_tokens=50)  # fmt: skip
    cur = scrape(12.0, drafts=260, draft_tokens=1040, accepted=520, accepted_per_pos=(234, 156, 91, 39), steps=40,
                 generation_tokens=780, prompt_tokens=90, kv_usage=0.4)  # fmt: skip
    w = window_between(prev, cur, k=0)
    assert w.k == 4  # from the worker's exported schedule, not the fallback argument
    assert w.duration_s == 2.0
    assert w.accepted_per_pos == (144, 96, 56, 24)
    assert w.decode_batch == 8.0  # 160 drafts / 20 steps
    assert w.accepted_length == pytest.approx(1 + 320 / 160)
    assert w.step_s == pytest.approx(0.1)
    assert w.kv_usage == 0.4


@pytest.mark.parametrize(
    ("cur", "why"),
    [
        (scrape(12.0, drafts=5), "counter reset"),
        (scrape(12.0, drafts=200, spec_version=4), "schedule changed"),
        (scrape(12.0, drafts=200, spec_schedule=((1, 256, 2),)), "schedule changed"),
        (scrape(10.0, drafts=200), "no time"),
    ],
)
def test_window_breaks(cur: WorkerScrape, why: str) -> None:
    with pytest.raises(WindowBreak, match=why):
        window_between(scrape(10.0, drafts=100), cur, k=4)


def test_idle_window_has_no_step_time_and_k0_batch_from_tokens() -> None:
    idle = window_between(scrape(0.0, running=0), scrape(2.0, running=0, steps=0), k=4)
    assert idle.step_s is None
    assert idle.decode_batch == 0.0
    k0 = window_between(
        scrape(0.0, spec_schedule=((1, 256, 0),)),
        scrape(2.0, spec_schedule=((1, 256, 0),), steps=50, generation_tokens=600),
        k=4,
    )
    assert k0.k == 0
    assert k0.decode_batch == 12.0


def synthetic_window(profile: Profile, rng: random.Random, *, k: int, batch: int, truth: tuple[float, ...],
                     context: float = 1000.0, slowdown: float = 1.0) -> Window:  # fmt: skip
    """A window of ``steps`` steps at ``batch`` sequences with acceptance drawn from ``truth``."""
    steps = 100
    drafts = steps * batch
    per_pos = [0.0] * len(truth)
    for _ in range(drafts):
        for i in range(k):
            if rng.random() >= truth[i]:
                break
            per_pos[i] += 1
    accepted = sum(per_pos)
    step = predict_step(profile, batch=batch, k=k, context_per_seq=context).total_s * slowdown
    return Window(
        duration_s=steps * step, k=k, drafts=drafts if k else 0, draft_tokens=drafts * k if k else 0,
        accepted=accepted, accepted_per_pos=tuple(per_pos), preemptions=0, generation_tokens=drafts + accepted,
        prompt_tokens=0, steps=steps, running=batch, waiting=0, kv_usage=batch * context / 2_000_000, busy=True,
    )  # fmt: skip


def test_estimator_recovers_observed_positions_and_shifts_the_prior(lab_profile: Profile) -> None:
    rng = random.Random(5)
    truth = tuple(min(p * 0.97, 0.99) for p in conditional_acceptance(lab_profile, "maths", 1000))
    est = WorkerEstimator("w0", lab_profile, 8)
    for _ in range(10):
        est.update(synthetic_window(lab_profile, rng, k=3, batch=8, truth=truth))
    e = est.estimate()
    assert e.observed_positions == 3
    for i in range(3):
        assert e.conditional[i] == pytest.approx(truth[i], abs=0.03)
    prior = est.prior()
    for i in range(3, 8):  # unobservable at k=3: the prior, shifted like the observed positions
        assert e.conditional[i] != prior[i]
        assert abs(e.conditional[i] - truth[i]) < abs(prior[i] - truth[i]) + 0.02
    assert e.batch == pytest.approx(8.0)
    assert e.context_per_seq == pytest.approx(1000.0, rel=0.01)
    assert e.step_correction == pytest.approx(1.0, rel=0.02)


def test_estimator_keeps_acceptance_when_speculation_is_off(lab_profile: Profile) -> None:
    rng = random.Random(1)
    truth = conditional_acceptance(lab_profile, "chat", 1000)
    est = WorkerEstimator("w0", lab_profile, 8)
    est.update(synthetic_window(lab_profile, rng, k=8, batch=4, truth=truth))
    before = est.estimate().conditional
    for _ in range(5):
        est.update(synthetic_window(lab_profile, rng, k=0, batch=32, truth=truth))
    e = est.estimate()
    assert e.conditional == pytest.approx(before, abs=0.01)
    assert e.k_current == 0
    assert e.accepted_length is None
    assert e.batch > 20


def test_positions_not_drafted_for_long_follow_the_shifted_prior(lab_profile: Profile) -> None:
    rng = random.Random(3)
    chat = conditional_acceptance(lab_profile, "chat", 1000)
    code = conditional_acceptance(lab_profile, "code", 1000)
    est = WorkerEstimator("w0", lab_profile, 8, EstimatorConfig(position_max_age=5))
    for _ in range(3):
        est.update(synthetic_window(lab_profile, rng, k=8, batch=8, truth=chat))
    for _ in range(4):  # the workload turns to code while k=2: positions 2… keep chat's figures for a while
        est.update(synthetic_window(lab_profile, rng, k=2, batch=8, truth=code))
    assert est.estimate().observed_positions == 8
    for _ in range(3):
        est.update(synthetic_window(lab_profile, rng, k=2, batch=8, truth=code))
    e = est.estimate()
    assert e.observed_positions == 2
    for i in range(2, 8):  # now from the prior shifted by code's acceptance at positions 0 and 1
        assert abs(e.conditional[i] - code[i]) < abs(e.conditional[i] - chat[i])


def test_step_correction_learns_a_slower_machine(lab_profile: Profile) -> None:
    rng = random.Random(2)
    truth = conditional_acceptance(lab_profile, "maths", 1000)
    est = WorkerEstimator("w0", lab_profile, 8, EstimatorConfig(alpha=0.5))
    for _ in range(12):
        est.update(synthetic_window(lab_profile, rng, k=4, batch=8, truth=truth, slowdown=1.5))
    assert est.estimate().step_correction == pytest.approx(1.5, rel=0.02)


def test_no_windows_gives_the_prior(lab_profile: Profile) -> None:
    e = WorkerEstimator("w0", lab_profile, 8).estimate()
    assert e.windows == 0
    assert e.drafts_seen == 0
    assert e.conditional == pytest.approx(conditional_acceptance(lab_profile, lab_profile.default_workload, 0))


def test_a_gear_not_measured_takes_the_nearest_measured_gear_at_this_batch(lab_profile: Profile) -> None:
    """Issue 25: the correction learned at k = 0 is not carried to every k when k = 1 was measured, and what was
    measured at batch 8 does not stand for batch 64."""
    rng = random.Random(3)
    truth = conditional_acceptance(lab_profile, "maths", 1000)
    est = WorkerEstimator("w0", lab_profile, 8, EstimatorConfig(alpha=1.0))
    est.update(synthetic_window(lab_profile, rng, k=0, batch=8, truth=truth, slowdown=2.0))
    est.update(synthetic_window(lab_profile, rng, k=1, batch=8, truth=truth, slowdown=0.5))
    e = est.estimate()
    assert e.correction_for(0) == pytest.approx(2.0, rel=1e-6)
    assert e.correction_for(3) == pytest.approx(0.5, rel=1e-6), "the nearest measured gear, k = 1"
    assert e.fresh_gears == (0, 1)
    for _ in range(2):  # the first window at 64 is the load step itself (no evidence), the second is measured
        est.update(synthetic_window(lab_profile, rng, k=1, batch=64, truth=truth, slowdown=0.8))
    wide = est.estimate()
    assert wide.fresh_gears == (1,), "at batch 64 only k = 1 was measured"


def test_a_window_on_a_load_step_is_no_evidence_about_its_gear(lab_profile: Profile) -> None:
    """Issue 25: a gear measured while the batch fills (a burst of prompts on a batch still growing) would stand
    against one measured in steady state, and the policy leaves the tuned table's gear on such comparisons."""
    rng = random.Random(5)
    truth = conditional_acceptance(lab_profile, "maths", 1000)
    est = WorkerEstimator("w0", lab_profile, 8, EstimatorConfig(alpha=1.0))
    est.update(synthetic_window(lab_profile, rng, k=0, batch=8, truth=truth))
    est.update(synthetic_window(lab_profile, rng, k=0, batch=40, truth=truth, slowdown=3.0))
    assert not est.estimate().observed_gear(0), "the step 8 → 40: not a measurement of k = 0 at 40"
    est.update(synthetic_window(lab_profile, rng, k=0, batch=42, truth=truth, slowdown=1.0))
    steady = est.estimate()
    assert steady.observed_gear(0)
    assert steady.correction_for(0) == pytest.approx(1.0, rel=1e-6), "only the steady window counts"


def test_a_stale_memory_of_a_gear_is_replaced_by_fresh_evidence(lab_profile: Profile) -> None:
    rng = random.Random(4)
    truth = conditional_acceptance(lab_profile, "maths", 1000)
    cfg = EstimatorConfig(alpha=0.3, position_max_age=3)
    est = WorkerEstimator("w0", lab_profile, 8, cfg)
    est.update(synthetic_window(lab_profile, rng, k=1, batch=8, truth=truth, slowdown=3.0))
    for _ in range(5):
        est.update(synthetic_window(lab_profile, rng, k=0, batch=8, truth=truth))
    est.update(synthetic_window(lab_profile, rng, k=1, batch=8, truth=truth, slowdown=0.5))
    assert est.estimate().correction_for(1) == pytest.approx(0.5, rel=1e-6)


def test_the_batch_ahead_adds_the_queue_up_to_the_largest_batch_and_the_kv_cache(lab_profile: Profile) -> None:
    rng = random.Random(3)
    truth = conditional_acceptance(lab_profile, "chat", 1000)
    est = WorkerEstimator("w0", lab_profile, 8)
    ramp = replace(synthetic_window(lab_profile, rng, k=2, batch=64, truth=truth), waiting=400.0, kv_usage=0.2)
    est.update(ramp)
    assert est.estimate().batch_ahead == pytest.approx(64 / 0.2)  # the KV cache holds 320 such sequences
    est.max_num_seqs = 256
    est.update(ramp)
    assert est.estimate().batch_ahead == 256.0  # the largest batch
    est.update(replace(ramp, waiting=0.0))
    assert est.estimate().batch_ahead == pytest.approx(64.0)  # no queue: the batch itself
