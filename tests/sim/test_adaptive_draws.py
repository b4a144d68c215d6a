"""Adaptive verification draws its noise as ``random.Random.gauss`` would, in the same order, leaving the generator
in the same state (``workers.sim.adaptive`` inlines CPython's Box-Muller; the lab's results depend on every draw)."""

from __future__ import annotations

import math
import random

import pytest

from fleet.perf import StepShape, load_profile, step_time
from workers.sim.adaptive import AdaptiveVerification, AdaptiveVerifier, probits

MI355X = load_profile("kimi-k3-dspark-mi355x-tp8")


def _through_gauss(
    verifier: AdaptiveVerifier, mus: list[tuple[float, ...]], caps: list[int], shape: StepShape, rng: random.Random
) -> tuple[list[int], list[int]]:
    """Verified and accepted lengths with every normal drawn by ``rng.gauss`` (the rule of the module docstring)."""
    n, k = shape.decode_seqs, shape.k
    at_cap = step_time(verifier.profile, shape)
    at_zero = step_time(verifier.profile, StepShape(n, 0, shape.context_tokens, shape.prefill_tokens))
    rate = verifier.rate_tok_s if verifier.rate_tok_s is not None else n / at_zero.total_s
    threshold = rate * (at_cap.target_s - at_zero.target_s) / (n * k)
    noise = verifier.config.confidence_noise
    sigma2 = noise**2
    shrink = 1.0 / (1.0 + sigma2)
    scale = 1.0 / math.sqrt(sigma2 * shrink) if sigma2 > 0 else math.inf
    verified, accepted = [], []
    for mu_s, cap in zip(mus, caps, strict=True):
        survive, v, acc, alive = 1.0, 0, 0, True
        for mu in mu_s[:cap]:
            eps = rng.gauss(0.0, 1.0)
            y_minus_mu = eps + rng.gauss(0.0, noise) if noise > 0 else eps
            z = (mu + y_minus_mu * shrink) * scale if sigma2 > 0 else (math.inf if mu + eps > 0 else -math.inf)
            survive *= 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))
            if survive < threshold:
                break
            v += 1
            if alive and mu + eps > 0:
                acc += 1
            else:
                alive = False
        verified.append(v)
        accepted.append(acc)
    return verified, accepted


@pytest.mark.parametrize("noise", [1.0, 0.4, 0.0])
@pytest.mark.parametrize("spare", [False, True])
def test_the_inlined_draws_are_gauss_draws(noise: float, spare: bool) -> None:
    """Every plan's verified and accepted lengths equal those drawn through ``rng.gauss``, and the generator (its
    cached second normal included) ends in the same state, whatever that cache held at the start."""
    mus = [probits((0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)), probits((0.5,) * 7), probits((0.95,) * 7)] * 5
    caps = [7, 3, 7, 5, 0] * 3
    shape = StepShape(15, 7, 15 * 3000)
    fast, slow = random.Random(11), random.Random(11)
    if spare:  # an odd number of normals drawn before: the generator holds a spare
        fast.gauss(0.0, 1.0)
        slow.gauss(0.0, 1.0)
    verifier = AdaptiveVerifier(MI355X, AdaptiveVerification(confidence_noise=noise))
    seen = 0
    for _ in range(50):
        want = _through_gauss(verifier, mus, caps, shape, slow)
        got = verifier.plan(mus, caps, shape, fast)
        assert (got.verified, got.accepted) == want
        assert fast.getstate() == slow.getstate()
        seen += sum(got.verified)
    assert seen > 0
