"""DSpark adaptive (confidence-scheduled) verification, as an engine-level mode of the simulator.

vLLM's DSpark adaptive verification (vllm-project/vllm#47808; vLLM blog 2026-08-14) drafts the whole block of
``num_speculative_tokens`` every step, scores each drafted token with the drafter's confidence head, ranks the
draft slots of the batch by survival probability (the cumulative product of per-position confidence) and
verifies the prefix that maximises estimated accepted tokens per millisecond, from step-cost curves profiled at
start-up. The batch-level budget is sized from the previous step's (stale) confidences, so no host sync is
needed; the per-request allocation uses the live ones. The cap k of the speculation schedule still bounds the
block: it is what the drafter proposes and what KV lookahead reserves.

The model here:

- **Confidence** (a calibrated head with Gaussian noise). Draft i of a sequence is accepted iff its latent margin
  ``x = Φ⁻¹(p_i) + ε`` is positive, ``ε ~ N(0, 1)``, where ``p_i`` is the profile's conditional acceptance at the
  sequence's context (so P(accept) = p_i, exactly the fixed-k sampler's rate). The head observes
  ``y = x + η``, ``η ~ N(0, σ²)``, and reports the posterior ``c_i = P(x > 0 | y) =
  Φ((μ + (y − μ)/(1 + σ²)) / sqrt(σ²/(1 + σ²)))`` with ``μ = Φ⁻¹(p_i)``: calibrated by construction, informative
  as ``σ`` is small (σ → ∞: c_i = p_i, the class mean; σ → 0: the head knows the outcome). σ = 1 is ASSUMED:
  the head explains half of the latent's variance (public reports call the head "well calibrated", e.g.
  lvyufeng/PocketLLM#60: match rate 20 % → 79 % across confidence bins, which a σ near 1 reproduces).
- **Choice** (the threshold form of #47808's rule). Verifying draft i of sequence s adds ``C_{s,i} = Π_{j≤i} c_j``
  expected tokens and about ``τ`` seconds of target time, where ``τ`` is the profile's marginal target time per
  verified token at this batch (the secant from 0 to the cap). Maximising expected tokens per second of the step
  verifies every slot with ``C_{s,i} ≥ λ·τ``, where λ is that rate itself; λ is carried from the previous step
  (a Dinkelbach iteration across steps: the stale budget). Slots are taken in prefix order because C only falls.
- **Cost**. The target verifies ``Σ_s (1 + v_s)`` tokens; its time is the profile's step time interpolated
  linearly in the mean verified length between the integer k on either side. The drafter runs its block at the
  cap (``fleet.perf.step_time``'s drafter term at the cap) plus the confidence head and ranking kernel:
  ``head_fixed_s + head_per_slot_s · n · cap`` (both ASSUMED; #47808's head is one linear layer per position and
  its budget sizing avoids a sync, so the cost is small). No CUDA-graph / eager distinction.

Units: seconds, tokens.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from statistics import NormalDist

from fleet.perf import Profile, StepShape, StepTime, step_time, step_time_of

_PHI_INV = NormalDist().inv_cdf
_SQRT2 = math.sqrt(2.0)
_P_CLAMP = 1e-6
_TWOPI = math.tau


@dataclass(frozen=True, slots=True)
class AdaptiveVerification:
    """Parameters of the adaptive-verification mode (all ASSUMED, see the module docstring)."""

    confidence_noise: float = 1.0
    """σ: standard deviation of the head's observation noise on the latent acceptance margin (0: an oracle)."""
    head_fixed_s: float = 1.0e-4
    """Confidence head and slot ranking, fixed part per step, seconds."""
    head_per_slot_s: float = 2.0e-7
    """Confidence head and slot ranking per drafted slot (sequence × position), seconds."""

    def __post_init__(self) -> None:
        if self.confidence_noise < 0 or self.head_fixed_s < 0 or self.head_per_slot_s < 0:
            raise ValueError("adaptive verification: confidence_noise and head costs must be ≥ 0")


def probits(probs: tuple[float, ...]) -> tuple[float, ...]:
    """Φ⁻¹ of each conditional acceptance probability (clamped away from 0 and 1)."""
    return tuple(_PHI_INV(min(max(p, _P_CLAMP), 1.0 - _P_CLAMP)) for p in probs)


@dataclass(slots=True)
class VerifyPlan:
    """What adaptive verification decided for one step: per decoding sequence, the verified length and the
    accepted drafts (in the order of the batch), the step time, and the expected tokens it planned for."""

    verified: list[int]
    accepted: list[int]
    time: StepTime
    expected_tokens: float


@dataclass
class AdaptiveVerifier:
    """The per-engine state of adaptive verification: its parameters and the carried rate λ (tokens/s)."""

    profile: Profile
    config: AdaptiveVerification = field(default_factory=AdaptiveVerification)
    rate_tok_s: float | None = None
    """λ: expected tokens per second of the last planned step (None before the first)."""

    def plan(
        self,
        mus: list[tuple[float, ...]],
        caps: list[int],
        shape: StepShape,
        rng: random.Random,
    ) -> VerifyPlan:
        """Sample each sequence's drafts and the head's confidences, choose verified lengths, time the step.

        ``mus[s]`` holds the probits of sequence s's conditional acceptance; ``caps[s]`` its drafted block (the
        schedule's k, or fewer where the token budget trimmed it); ``shape`` the step at the cap."""
        n, k = shape.decode_seqs, shape.k
        at_cap = step_time(self.profile, shape)
        at_zero = step_time_of(self.profile, n, 0, shape.context_tokens, shape.prefill_tokens)
        tau = (at_cap.target_s - at_zero.target_s) / (n * k)
        rate = self.rate_tok_s if self.rate_tok_s is not None else n / at_zero.total_s
        threshold = rate * tau
        sigma2 = self.config.confidence_noise**2
        shrink = 1.0 / (1.0 + sigma2)
        scale = 1.0 / math.sqrt(sigma2 * shrink) if sigma2 > 0 else math.inf
        noise, erf = self.config.confidence_noise, math.erf
        # rng.gauss inlined (CPython's Box-Muller with its cached second value, rng.gauss_next): the same draws
        # in the same order as gauss(0.0, 1.0) and gauss(0.0, noise), without a Python call per draw.
        rand, log, sqrt, cos, sin = rng.random, math.log, math.sqrt, math.cos, math.sin
        spare: float | None = rng.gauss_next  # type: ignore[attr-defined]  # CPython's gauss cache, not typed
        verified: list[int] = []
        accepted: list[int] = []
        expected = float(n)
        for mu_s, cap in zip(mus, caps, strict=True):
            survive, v, acc, alive = 1.0, 0, 0, True
            for i in range(cap):
                mu = mu_s[i]
                if spare is None:
                    x2pi = rand() * _TWOPI
                    g2rad = sqrt(-2.0 * log(1.0 - rand()))
                    eps = 0.0 + cos(x2pi) * g2rad * 1.0
                    spare = sin(x2pi) * g2rad
                else:
                    eps, spare = 0.0 + spare * 1.0, None
                if noise > 0:
                    if spare is None:
                        x2pi = rand() * _TWOPI
                        g2rad = sqrt(-2.0 * log(1.0 - rand()))
                        y_minus_mu = eps + (0.0 + cos(x2pi) * g2rad * noise)
                        spare = sin(x2pi) * g2rad
                    else:
                        y_minus_mu, spare = eps + (0.0 + spare * noise), None
                else:
                    y_minus_mu = eps
                z = (mu + y_minus_mu * shrink) * scale if sigma2 > 0 else (math.inf if mu + eps > 0 else -math.inf)
                survive *= 0.5 * (1.0 + erf(z / _SQRT2))
                if survive < threshold:
                    break
                v += 1
                expected += survive
                if alive and mu + eps > 0:
                    acc += 1
                else:
                    alive = False
            verified.append(v)
            accepted.append(acc)
        rng.gauss_next = spare  # type: ignore[attr-defined]
        time = self._time(shape, sum(verified), at_cap, at_zero)
        self.rate_tok_s = expected / time.total_s
        return VerifyPlan(verified, accepted, time, expected)

    def _time(self, shape: StepShape, verified: int, at_cap: StepTime, at_zero: StepTime) -> StepTime:
        """Target time at ``verified`` drafts over the batch (linear in the mean between integer k), drafter at
        the cap plus the confidence head."""
        n, k = shape.decode_seqs, shape.k
        lo, rem = divmod(verified, n)
        frac = rem / n

        def target(kk: int) -> float:
            if kk == 0:
                return at_zero.target_s
            if kk == k:
                return at_cap.target_s
            return step_time_of(self.profile, n, kk, shape.context_tokens, shape.prefill_tokens).target_s

        target_s = target(lo) if frac == 0 else (1 - frac) * target(lo) + frac * target(lo + 1)
        head = self.config.head_fixed_s + self.config.head_per_slot_s * n * k
        return StepTime(target_s, at_cap.drafter_s + head)
