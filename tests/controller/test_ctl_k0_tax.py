"""The k = 0 tax (issue 14): a worker started with a drafter pays for it at k = 0 too. The profile term
(``fleet.perf.IdleDrafterTax``), the policy's k = 0 and drafter-free predictions, and the cost model's
counterfactuals."""

from __future__ import annotations

import pytest

from controller.cost import worker_cost
from controller.policy import PolicyConfig, decide
from controller.window import Window
from fleet.perf import IdleDrafterTax, Profile, StepShape, load_profile, step_time

from .ctl_helpers import make_estimate

GPU_PROFILES = ("kimi-k3-dspark-tp16", "kimi-k3-dspark-mi355x-tp8")
CFG = PolicyConfig()


def taxed(profile: Profile, tax: IdleDrafterTax) -> Profile:
    return profile.model_copy(update={"drafter": profile.drafter.model_copy(update={"k0_tax": tax})})


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_the_gpu_profiles_carry_the_public_figure_rising_with_batch(name: str) -> None:
    profile = load_profile(name)
    tax = profile.drafter.k0_tax
    assert tax is not None
    assert (tax.at_batch_1, tax.at_high_batch) == (0.065, 0.216)
    assert tax.high_batch == profile.serving.max_num_seqs
    ratios = []
    for batch in (1, 4, 16, tax.high_batch, 2 * tax.high_batch):
        shape = StepShape(batch, 0, batch * 2000)
        off = step_time(profile, shape)
        loaded = step_time(profile, StepShape(batch, 0, batch * 2000, drafter_loaded=True))
        assert off.drafter_s == 0.0, "a worker started without speculation pays nothing (the calibration's k=0)"
        assert loaded.target_s == off.target_s
        ratios.append(loaded.total_s / off.total_s - 1)
    assert ratios[0] == pytest.approx(0.065)
    assert ratios[-2] == ratios[-1] == pytest.approx(0.216)
    assert ratios == sorted(ratios)


def test_the_tax_is_only_for_k_0_with_a_drafter_loaded() -> None:
    profile = load_profile(GPU_PROFILES[0])
    for k in (1, 7):
        assert step_time(profile, StepShape(8, k, 16000, drafter_loaded=True)) == step_time(
            profile, StepShape(8, k, 16000)
        )
    assert step_time(profile, StepShape(0, 0, 0, 4096, drafter_loaded=True)).drafter_s == 0.0, "prefill only"


def test_the_policy_counts_the_tax_at_k_0_and_predicts_the_drafter_free_worker_apart(lab_profile: Profile) -> None:
    profile = taxed(lab_profile, IdleDrafterTax(at_batch_1=0.1, at_high_batch=0.1, high_batch=1))
    est = make_estimate(profile, "chat", batch=64.0, prefill_per_token=0.0)
    d = decide(est, profile, tpot_target_s=None, config=CFG)
    k0, off = d.candidate(0), d.off
    assert k0 is not None
    assert off is not None
    assert off.drafter_s == 0.0
    assert k0.drafter_s == pytest.approx(0.1 * k0.target_s)
    assert k0.goodput_tok_s == pytest.approx(off.goodput_tok_s / 1.1)
    plain = decide(est, lab_profile, tpot_target_s=None, config=CFG)
    plain_k0, plain_off = plain.candidate(0), plain.off
    assert plain_k0 is not None
    assert plain_off is not None
    assert plain_k0.step_s == plain_off.step_s, "no tax in the profile: k=0 and drafter-free are the same"


def test_the_tax_can_turn_the_choice_away_from_k_0(lab_profile: Profile) -> None:
    """At a batch where k = 0 wins by less than the tax, a worker with its drafter loaded keeps a short draft."""
    profile = taxed(lab_profile, IdleDrafterTax(at_batch_1=0.2, at_high_batch=0.2, high_batch=1))
    flips = []
    for batch in range(1, 257):
        est = make_estimate(lab_profile, "chat", batch=float(batch), k_current=1)
        without = decide(est, lab_profile, tpot_target_s=None, config=CFG)
        with_tax = decide(est, profile, tpot_target_s=None, config=CFG)
        if without.k == 0 and with_tax.k > 0:
            flips.append(batch)
    assert flips, "the lab profile's break-even batch moves up under a 20 % tax"


def window(k: int) -> Window:
    return Window(
        duration_s=2.0, k=k, drafts=0.0, draft_tokens=0.0, accepted=0.0, accepted_per_pos=(), preemptions=0.0,
        generation_tokens=1600.0, prompt_tokens=0.0, steps=50.0, running=32.0, waiting=0.0, kv_usage=0.2,
        busy=True,
    )  # fmt: skip


def test_the_cost_model_charges_the_tax_to_the_drafter_and_prices_the_drafter_free_worker() -> None:
    profile = load_profile(GPU_PROFILES[0])
    est = make_estimate(profile, "chat", batch=32.0, k_current=0, k_max=7, prefill_per_token=0.0)
    d = decide(est, profile, tpot_target_s=None, config=CFG)
    k0, off = d.candidate(0), d.off
    assert k0 is not None
    assert off is not None
    cost = worker_cost(usd_per_s=1.0, window=window(0), current=k0, k0=k0, off=off)
    assert cost.usd_k0 == cost.usd, "at k=0 the counterfactual at k=0 is the actual cost"
    assert cost.drafter_share == pytest.approx(50 * k0.drafter_s / 2.0)
    assert cost.drafter_share > 0
    assert cost.usd_off is not None
    busy = 50 * k0.step_s  # under the 2 s window: the rest is idle, kept as it is
    assert busy < 2.0
    assert cost.usd_off == pytest.approx(2.0 - busy + busy * off.step_s / k0.step_s)
    assert cost.usd_off < cost.usd
    assert cost.usd_per_mtok_off is not None
    assert cost.usd_per_mtok is not None
    assert cost.usd_per_mtok_off < cost.usd_per_mtok
