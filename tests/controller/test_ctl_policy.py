"""The policy as a pure function over hand-built estimates (table-driven)."""

from __future__ import annotations

import operator
from dataclasses import replace
from itertools import accumulate
from typing import Any

import pytest

from controller.estimator import Estimate
from controller.policy import (
    TABLE_MAX_NUM_SEQS,
    Basis,
    Candidate,
    Decision,
    PolicyConfig,
    Risk,
    decide,
    mean_prompt_tokens,
    observed_mix,
)
from fleet.fallback import tuned_table
from fleet.perf import Profile, conditional_acceptance

from .ctl_helpers import make_estimate

CFG = PolicyConfig(start_from_table=False)
"""The model alone: these tests are about its predictions (the tuned-table start has its own, below)."""


def candidate(decision: Decision, k: int) -> Candidate:
    """The decision's candidate at ``k`` (which the test knows was evaluated)."""
    found = decision.candidate(k)
    assert found is not None, f"no candidate at k={k}"
    return found


def test_low_load_chooses_k_max_and_high_load_turns_speculation_off(lab_profile: Profile) -> None:
    low = decide(make_estimate(lab_profile, batch=1.0), lab_profile, tpot_target_s=None, config=CFG)
    high = decide(make_estimate(lab_profile, batch=128.0), lab_profile, tpot_target_s=None, config=CFG)
    assert low.k == 8
    assert high.k == 0
    assert not low.overloaded
    assert low.gain > 0  # current k=4 is worse than k=8 at batch 1


def test_k_never_rises_with_load(lab_profile: Profile) -> None:
    ks = [
        decide(make_estimate(lab_profile, batch=b), lab_profile, tpot_target_s=None, config=CFG).k
        for b in (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
    ]
    assert ks == sorted(ks, reverse=True)
    assert ks[0] > ks[len(ks) // 2] > ks[-1] == 0


def test_chat_gets_a_lower_k_than_maths(lab_profile: Profile) -> None:
    for batch in (1.0, 8.0, 16.0):
        maths = decide(make_estimate(lab_profile, "maths", batch=batch), lab_profile, tpot_target_s=None, config=CFG)
        chat = decide(make_estimate(lab_profile, "chat", batch=batch), lab_profile, tpot_target_s=None, config=CFG)
        assert chat.k < maths.k, batch


def test_goodput_is_max_over_candidates_and_tpot_is_step_over_al(lab_profile: Profile) -> None:
    d = decide(make_estimate(lab_profile, batch=8.0), lab_profile, tpot_target_s=None, config=CFG)
    best = max(d.candidates, key=lambda c: c.goodput_tok_s)
    assert d.k == best.k
    for c in d.candidates:
        assert c.tpot_s == pytest.approx(c.step_s / c.accepted_length)
        assert c.goodput_tok_s == pytest.approx(8.0 * c.accepted_length / c.step_s)
    assert [c.k for c in d.candidates] == list(range(9))


@pytest.mark.parametrize(
    ("case", "overrides", "expect_k", "expect_risk"),
    [
        ("acceptance collapse", {"k_current": 4, "accepted_length": 1.05}, 0, Risk.COLLAPSE),
        ("KV pressure", {"k_current": 6, "kv_usage": 0.95}, "below", Risk.KV),
        ("rising preemptions", {"k_current": 6, "preemption_rate": 0.5}, "below", Risk.PREEMPTION),
        ("KV pressure at k=0 stays off", {"k_current": 0, "kv_usage": 0.97, "accepted_length": None}, 0, Risk.KV),
        ("no drafts yet", {"drafts_seen": 0.0, "observed_positions": 0, "accepted_length": None}, 8, Risk.NONE),
        ("k=0: acceptance unobservable", {"k_current": 0, "accepted_length": None}, 8, Risk.NONE),
    ],
)
def test_edge_cases(
    lab_profile: Profile, case: str, overrides: dict[str, Any], expect_k: int | str, expect_risk: Risk
) -> None:
    est = make_estimate(lab_profile, batch=1.0, **overrides)
    d = decide(est, lab_profile, tpot_target_s=None, config=CFG)
    assert d.risk is expect_risk, case
    if expect_k == "below":
        assert d.k < est.k_current, case
    else:
        assert d.k == expect_k, case
    assert d.reason, case


def test_no_drafts_yet_says_the_prior_is_used(lab_profile: Profile) -> None:
    est = make_estimate(lab_profile, drafts_seen=0.0, observed_positions=0, accepted_length=None)
    assert "prior" in decide(est, lab_profile, tpot_target_s=None, config=CFG).reason


def test_infeasible_target_maximises_per_user_speed_and_flags_overload(lab_profile: Profile) -> None:
    d = decide(make_estimate(lab_profile, batch=64.0), lab_profile, tpot_target_s=0.001, config=CFG)
    assert d.overloaded
    assert d.k == min(d.candidates, key=lambda c: c.tpot_s).k
    assert "overloaded" in d.reason


def test_feasible_target_is_not_overloaded(lab_profile: Profile) -> None:
    d = decide(make_estimate(lab_profile, batch=4.0), lab_profile, tpot_target_s=0.05, config=CFG)
    assert not d.overloaded
    margin = 1 - CFG.tpot_margin  # a k above the current 4 needs the margin to spare
    assert all(c.feasible == (c.tpot_s <= 0.05 * (margin if c.k > 4 else 1.0)) for c in d.candidates)


def test_a_k_above_the_current_one_needs_the_margin_to_meet_the_target(lab_profile: Profile) -> None:
    at8 = decide(make_estimate(lab_profile, batch=8.0, k_current=8), lab_profile, tpot_target_s=None, config=CFG)
    c8 = candidate(at8, 8)
    target = c8.tpot_s / (1 - CFG.tpot_margin / 2)  # met, with half the margin to spare
    stay = decide(make_estimate(lab_profile, batch=8.0, k_current=8), lab_profile, tpot_target_s=target, config=CFG)
    rise = decide(make_estimate(lab_profile, batch=8.0, k_current=2), lab_profile, tpot_target_s=target, config=CFG)
    assert candidate(stay, 8).feasible
    assert not candidate(rise, 8).feasible


MIX = (("maths", 0.5), ("chat", 0.5))


def mixed_estimate(profile: Profile, **overrides: Any) -> Estimate:
    """Half the request-steps maths, half chat: the worker's blended acceptance and its fitted mix."""
    curves = [list(accumulate(conditional_acceptance(profile, c, 2000), operator.mul)) for c, _ in MIX]
    blend = [sum(s * curve[i] for (_, s), curve in zip(MIX, curves, strict=True)) for i in range(8)]
    cond = tuple(a / b for a, b in zip(blend, [1.0, *blend[:-1]], strict=True))
    base = make_estimate(profile, conditional=cond, class_mix=MIX, k_current=8, observed_positions=8)
    return replace(base, **overrides)


def test_the_target_binds_on_the_slowest_class_not_the_blend(lab_profile: Profile) -> None:
    est = mixed_estimate(lab_profile, batch=1.0)
    kb = decide(replace(est, class_mix=()), lab_profile, tpot_target_s=None, config=CFG).k  # the blend's best k
    free = decide(est, lab_profile, tpot_target_s=None, config=CFG)
    cb = candidate(free, kb)
    assert cb.tpot_slowest_s is not None
    floor = max(cb.tpot_s, min(c.tpot_worst_s for c in free.candidates))
    target = (cb.tpot_worst_s + floor) / 2
    assert cb.tpot_s < target < cb.tpot_worst_s  # the blend meets it at kb, chat does not
    d = decide(est, lab_profile, tpot_target_s=target, config=CFG)
    assert d.k != kb
    assert not d.overloaded
    assert candidate(d, d.k).tpot_worst_s <= target
    assert "slowest class" in d.reason
    blended = decide(replace(est, class_mix=()), lab_profile, tpot_target_s=target, config=CFG)
    assert blended.k == kb  # what the blend alone would have run


def test_overloaded_with_a_queue_drains_it_and_without_one_serves_the_slowest_class(lab_profile: Profile) -> None:
    queued = decide(mixed_estimate(lab_profile, batch=4.0, waiting=20.0), lab_profile, tpot_target_s=1e-3, config=CFG)
    idle = decide(mixed_estimate(lab_profile, batch=4.0, waiting=0.0), lab_profile, tpot_target_s=1e-3, config=CFG)
    assert queued.overloaded
    assert idle.overloaded
    assert queued.k == max(queued.candidates, key=lambda c: c.goodput_tok_s).k
    fastest = min(c.tpot_worst_s for c in idle.candidates)
    assert candidate(idle, idle.k).tpot_worst_s <= fastest * (1 + CFG.overload_tpot_tolerance)
    assert queued.k != idle.k


def test_sla_risk_when_current_k_misses_a_target_another_k_meets(lab_profile: Profile) -> None:
    est = make_estimate(lab_profile, batch=96.0, k_current=8)
    probe = decide(est, lab_profile, tpot_target_s=None, config=CFG)
    cur, best = candidate(probe, 8), candidate(probe, probe.k)
    assert best.tpot_s < cur.tpot_s
    target = (cur.tpot_s + best.tpot_s) / 2
    d = decide(est, lab_profile, tpot_target_s=target, config=CFG)
    assert d.risk is Risk.SLA
    assert d.k < 8


def test_candidates_respect_k_max_and_tiers(lab_profile: Profile) -> None:
    est = make_estimate(
        lab_profile, k_max=4, k_current=4, conditional=conditional_acceptance(lab_profile, "maths", 0)[:4]
    )
    d = decide(est, lab_profile, tpot_target_s=None, config=PolicyConfig(k_tiers=(0, 2, 4, 8)))
    assert [c.k for c in d.candidates] == [0, 2, 4]


def test_step_correction_scales_predictions_not_the_choice(lab_profile: Profile) -> None:
    est = make_estimate(lab_profile, batch=8.0)
    a = decide(est, lab_profile, tpot_target_s=None, config=CFG)
    b = decide(replace(est, step_correction=2.0), lab_profile, tpot_target_s=None, config=CFG)
    assert a.k == b.k
    for ca, cb in zip(a.candidates, b.candidates, strict=True):
        assert cb.step_s == pytest.approx(2 * ca.step_s)


def test_pure(lab_profile: Profile) -> None:
    est = make_estimate(lab_profile, batch=12.0)
    assert decide(est, lab_profile, tpot_target_s=0.03, config=CFG) == decide(
        est, lab_profile, tpot_target_s=0.03, config=CFG
    )


def test_a_k_that_barely_slows_the_slowest_class_may_miss_the_target_for_goodput(lab_profile: Profile) -> None:
    est = mixed_estimate(lab_profile, batch=4.0)
    free = decide(est, lab_profile, tpot_target_s=None, config=CFG)
    fastest = min(free.candidates, key=lambda c: c.tpot_worst_s)
    band = [c for c in free.candidates if c.tpot_worst_s <= fastest.tpot_worst_s * (1 + CFG.overload_tpot_tolerance)]
    richest = max(band, key=lambda c: c.goodput_tok_s)
    assert richest.k != fastest.k  # precondition: the band holds a k with more goodput than the TPOT argmin
    d = decide(est, lab_profile, tpot_target_s=fastest.tpot_worst_s, config=CFG)  # only the argmin meets it
    assert [c.k for c in d.candidates if c.feasible] == [fastest.k]
    assert d.k == richest.k
    assert not d.overloaded


def test_a_ttft_target_lowers_k_when_long_drafts_slow_the_prefill_steps(lab_profile: Profile) -> None:
    """Long prompts beside a decode batch: every verified token takes budget from the prefill chunk and time from
    the step, so a TTFT target between two k's predicted prefill times rules out the longer drafts."""
    est = make_estimate(lab_profile, batch=16.0, prefill_per_token=20.0, context_per_seq=8000.0)
    free = decide(est, lab_profile, tpot_target_s=None, config=CFG)
    prefill = {c.k: c.ttft_s for c in free.candidates if c.ttft_s is not None}
    assert len(prefill) == len(free.candidates), "every k has a predicted prefill time"
    ks = sorted(prefill)
    assert [prefill[k] for k in ks] == sorted(prefill[k] for k in ks), "longer drafts, slower prefill"
    lower = max(k for k in ks if k < free.k)
    target = (prefill[lower] + prefill[free.k]) / 2
    bound = decide(est, lab_profile, tpot_target_s=None, ttft_target_s=target, config=CFG)
    assert bound.k == lower < free.k
    assert candidate(bound, free.k).ttft_ok is False
    assert candidate(bound, lower).ttft_ok
    assert "TTFT target" in bound.reason
    unreachable = decide(est, lab_profile, tpot_target_s=None, ttft_target_s=prefill[0] / 2, config=CFG)
    assert unreachable.k == free.k, "no k meets it: k cannot help, the target is set aside"
    assert "set aside" in unreachable.reason


def test_candidates_are_every_gear_up_to_k_max(lab_profile: Profile) -> None:
    """Issue 25: on a k_max = 7 checkpoint, 7 is a candidate from any k, not only while it is the current k."""
    est = make_estimate(
        lab_profile, k_max=7, k_current=3, conditional=conditional_acceptance(lab_profile, "maths", 0)[:7]
    )
    d = decide(est, lab_profile, tpot_target_s=None, config=CFG)
    assert [c.k for c in d.candidates] == list(range(8))


def test_candidates_are_the_advertised_full_speed_gears(lab_profile: Profile) -> None:
    """A worker advertising graphs for k ∈ {0, 2, 5, 7} (at some batch) gets those candidates and its current k."""
    est = make_estimate(
        lab_profile, k_max=7, k_current=3, conditional=conditional_acceptance(lab_profile, "maths", 0)[:7]
    )
    full_speed = ((0, 1, 64), (2, 1, 32), (5, 1, 16), (7, 1, 8))
    d = decide(est, lab_profile, tpot_target_s=None, config=CFG, full_speed=full_speed)
    assert [c.k for c in d.candidates] == [0, 2, 3, 5, 7]


def test_a_queue_being_admitted_is_decided_for_the_batch_it_makes(lab_profile: Profile) -> None:
    # A load step: the smoothed batch still says 1, the last window 1 running with 127 waiting.
    def k(**estimate: float) -> int:
        return decide(make_estimate(lab_profile, "maths", **estimate), lab_profile, tpot_target_s=None, config=CFG).k

    assert (k(batch=1.0), k(batch=1.0, batch_ahead=128.0)) == (8, k(batch=128.0))
    assert k(batch=128.0) == 0


# ------------------------------------------------------------------ issue 25: start from the tuned table
TABLE_CFG = PolicyConfig()


def test_the_worker_starts_from_the_tuned_table_for_the_mix_it_sees(lab_profile: Profile) -> None:
    """Issue 25: nothing measured yet, the policy takes the gear ``vllm-table`` tunes from the profile for the
    observed mix (``fleet.fallback.tuned_table``), not the model's argmax, even where the model predicts more."""
    est = make_estimate(lab_profile, batch=1.0, class_mix=(("chat", 1.0),), prefill_per_token=4.0)
    d = decide(est, lab_profile, tpot_target_s=None, config=TABLE_CFG)
    table = tuned_table(lab_profile, observed_mix(est, lab_profile), TABLE_MAX_NUM_SEQS)
    expected = next(k for lo, hi, k in table if lo <= 1 <= hi)
    model = decide(est, lab_profile, tpot_target_s=None, config=CFG)
    assert model.k != expected, "the case needs a model that disagrees with the table"
    assert (d.k, d.table_k, d.basis) == (expected, expected, Basis.TABLE)
    assert "tuned table's gear" in d.reason
    assert "not yet measured" in d.reason


def test_a_gear_the_model_prefers_is_chosen_over_the_table_only_once_both_are_measured(lab_profile: Profile) -> None:
    est = make_estimate(lab_profile, batch=1.0, class_mix=(("chat", 1.0),), prefill_per_token=4.0)
    table_k = decide(est, lab_profile, tpot_target_s=None, config=TABLE_CFG).table_k
    model_k = decide(est, lab_profile, tpot_target_s=None, config=CFG).k
    assert table_k is not None
    assert model_k != table_k
    only_model = replace(est, fresh_gears=(model_k,), step_correction_by_k=((model_k, 1.0),))
    assert decide(only_model, lab_profile, tpot_target_s=None, config=TABLE_CFG).k == table_k, "table unmeasured"
    both = replace(est, fresh_gears=(table_k, model_k), step_correction_by_k=((table_k, 1.0), (model_k, 1.0)))
    d = decide(both, lab_profile, tpot_target_s=None, config=TABLE_CFG)
    assert (d.k, d.basis) == (model_k, Basis.MEASURED)
    assert f"measured at this batch: k={model_k}" in d.reason
    assert f"k={table_k}" in d.reason
    slower = replace(both, step_correction_by_k=((table_k, 1.0), (model_k, 3.0)))
    d = decide(slower, lab_profile, tpot_target_s=None, config=TABLE_CFG)
    assert (d.k, d.basis) == (table_k, Basis.TABLE_MEASURED), "measured slower than the table: the table stays"


def test_safety_paths_override_the_table(lab_profile: Profile) -> None:
    est = make_estimate(lab_profile, batch=1.0, k_current=4, accepted_length=1.05, class_mix=(("maths", 1.0),))
    d = decide(est, lab_profile, tpot_target_s=None, config=TABLE_CFG)
    assert (d.k, d.risk, d.basis) == (0, Risk.COLLAPSE, Basis.MODEL)


def test_the_table_gear_is_one_the_worker_advertises(lab_profile: Profile) -> None:
    est = make_estimate(lab_profile, batch=1.0, class_mix=(("maths", 1.0),), prefill_per_token=4.0)
    d = decide(est, lab_profile, tpot_target_s=None, config=PolicyConfig(k_tiers=(0, 2, 5)))
    assert d.table_k in (0, 2, 5)
    assert d.k in (0, 2, 5)


def test_a_ttft_target_that_rules_out_the_tables_gear_leaves_the_choice_to_the_model(lab_profile: Profile) -> None:
    """The TTFT filter is a prediction: where it rules out the table's gear, the choice is the model's (which the
    stabiliser moves to only on its gain threshold), not the table's gear snapped into the predicted set (a
    flicker of that prediction sent a queued worker from k = 7 to k = 1 at once, without the threshold)."""
    est = make_estimate(lab_profile, batch=8.0, class_mix=(("maths", 1.0),), prefill_per_token=4.0, waiting=20.0)
    free = decide(est, lab_profile, tpot_target_s=None, config=TABLE_CFG)
    assert free.basis is Basis.TABLE
    ttft = {c.k: c.ttft_s or 0.0 for c in free.candidates}
    assert free.table_k is not None
    assert free.table_k > 1, "the case needs a table gear above k = 1"
    assert 0.0 < ttft[1] < ttft[2]
    target = (ttft[1] + ttft[2]) / 2
    d = decide(est, lab_profile, tpot_target_s=None, config=TABLE_CFG, ttft_target_s=target)
    assert d.table_k == free.table_k, "the table's gear is the table's, not snapped into the predicted set"
    assert d.basis is Basis.MODEL
    assert d.k <= 1


def test_at_its_batch_limit_a_queue_waits_for_slots_that_a_faster_gear_frees_sooner(lab_profile: Profile) -> None:
    """Lab, B300 concurrency-sweep at 128 streams on 32 slots (96 waiting): the predicted TTFT counted the queue
    as prompts waiting for the prefill budget, which a longer draft shrinks, so the TTFT target walked the worker
    down from the table's k = 7 to k = 2 (-16 % goodput in the phase). A full batch admits a waiting request only
    when a running one finishes: the queue drains at the completion rate, B · AL(k) / (T(B, k) · output), which
    the gear with the most goodput raises most."""
    est = make_estimate(
        lab_profile, batch=32.0, max_num_seqs=32, waiting=96.0, prefill_per_token=2.5, context_per_seq=1200.0
    )
    d = decide(est, lab_profile, tpot_target_s=None, config=CFG)
    ttft = {c.k: c.ttft_s for c in d.candidates if c.ttft_s is not None}
    assert len(ttft) == len(d.candidates)
    output = mean_prompt_tokens(est) / est.prefill_per_token
    for c in d.candidates:  # the 97 requests to admit, at the rate this gear completes them
        assert ttft[c.k] >= 97 * output / c.goodput_tok_s
    richest = max(d.candidates, key=lambda c: c.goodput_tok_s)
    assert min(ttft, key=ttft.__getitem__) == richest.k
    target = ttft[richest.k] * 1.01
    bound = decide(est, lab_profile, tpot_target_s=None, ttft_target_s=target, config=CFG)
    assert bound.k == richest.k
    free_slots = replace(est, max_num_seqs=256)
    d = decide(free_slots, lab_profile, tpot_target_s=None, config=CFG)
    ttft = {c.k: c.ttft_s for c in d.candidates if c.ttft_s is not None}
    assert min(ttft, key=ttft.__getitem__) == 0, "slots free for the whole queue: only the prefill budget counts"
