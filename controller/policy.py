"""The policy: a pure function from one worker's estimate to the k it should run (STYLE 8).

For every candidate k in the tier set (≤ the worker's k_max) it predicts the mean tokens per request-step
``AL(k) = fleet.perf.expected_tokens_per_step(conditional, k)`` and the step time
``T(B, k) = fleet.perf.step_time × correction`` at the mean decode batch B, carrying the prefill that comes with
the tokens it emits (prompt tokens per output token × B × AL(k)), hence goodput ``B·AL/T`` (tokens/s) and TPOT
``T/AL`` (seconds). It picks the k with the highest goodput among those whose TPOT meets the target of
the tiers the worker serves; if none does, the k with the lowest TPOT, flagged ``overloaded``.

One k per worker, not a per-batch-size table: the decode batch is measured as a mean over a window, and a table
keyed on the instantaneous batch (which includes prefills and flickers) is what collapses throughput at its
threshold in vLLM #49548. At a fixed B the goodput argmax is also the TPOT argmin, so the target mostly decides
``overloaded``; safety caps (KV, preemptions, acceptance collapse) restrict the candidate set first.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from controller.estimator import Estimate
from controller.model import predict_step
from fleet.perf import Profile, expected_tokens_per_step

DEFAULT_K_TIERS = (0, 1, 2, 3, 4, 6, 8)


class PolicyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    k_tiers: tuple[int, ...] = DEFAULT_K_TIERS
    """The small set of k the controller moves between (intersected with each worker's 0…k_max)."""
    kv_high: float = Field(0.9, gt=0, le=1)
    """KV usage at or above which k must come down (drafts reserve KV lookahead)."""
    preemption_rate_high: float = Field(0.05, ge=0)
    """Preemptions per second above which k must come down."""
    collapse_accepted_length: float = Field(1.15, ge=1)
    """Observed tokens per request-step at the current k below which acceptance has collapsed: k → 0."""


class Risk(StrEnum):
    NONE = "none"
    KV = "kv"
    PREEMPTION = "preemption"
    COLLAPSE = "collapse"
    SLA = "sla"


@dataclass(frozen=True, slots=True)
class Candidate:
    """Predictions for one k. Seconds and tokens per second."""

    k: int
    step_s: float
    target_s: float
    drafter_s: float
    accepted_length: float
    goodput_tok_s: float
    tpot_s: float
    feasible: bool
    allowed: bool


@dataclass(frozen=True, slots=True)
class Decision:
    worker_id: str
    k: int
    candidates: tuple[Candidate, ...]
    overloaded: bool
    risk: Risk
    gain: float
    """Predicted relative goodput gain of ``k`` over the current k (0.1 = +10 %)."""
    reason: str

    def candidate(self, k: int) -> Candidate | None:
        return next((c for c in self.candidates if c.k == k), None)


def _predict(est: Estimate, profile: Profile, k: int, target: float | None, allowed: bool) -> Candidate:
    batch = max(est.batch, 1.0)
    al = expected_tokens_per_step(est.conditional, k)
    prefill = est.prefill_per_token * batch * al  # the prompts that follow the tokens this step emits
    raw = predict_step(profile, batch=batch, k=k, context_per_seq=est.context_per_seq, prefill_per_step=prefill)
    c = est.step_correction
    step = raw.total_s * c
    tpot = step / al
    return Candidate(
        k=k,
        step_s=step,
        target_s=raw.target_s * c,
        drafter_s=raw.drafter_s * c,
        accepted_length=al,
        goodput_tok_s=batch * al / step,
        tpot_s=tpot,
        feasible=target is None or tpot <= target,
        allowed=allowed,
    )


def _risk(est: Estimate, cfg: PolicyConfig) -> tuple[Risk, str]:
    if est.k_current > 0 and est.accepted_length is not None and est.accepted_length < cfg.collapse_accepted_length:
        return Risk.COLLAPSE, f"acceptance collapsed (AL {est.accepted_length:.2f} at k={est.k_current})"
    if est.kv_usage >= cfg.kv_high:
        return Risk.KV, f"KV {est.kv_usage:.0%} ≥ {cfg.kv_high:.0%}"
    if est.preemption_rate > cfg.preemption_rate_high:
        return Risk.PREEMPTION, f"preemptions {est.preemption_rate:.2f}/s"
    return Risk.NONE, ""


def _allowed(k: int, est: Estimate, risk: Risk) -> bool:
    if risk is Risk.COLLAPSE:
        return k == 0
    if risk in (Risk.KV, Risk.PREEMPTION):
        return k < est.k_current or k == 0
    return True


def decide(est: Estimate, profile: Profile, *, tpot_target_s: float | None, config: PolicyConfig) -> Decision:
    """Choose the k for one worker (pure: same inputs, same decision)."""
    ks = sorted({k for k in config.k_tiers if k <= est.k_max} | {min(est.k_current, est.k_max)})
    risk, risk_text = _risk(est, config)
    cands = tuple(_predict(est, profile, k, tpot_target_s, _allowed(k, est, risk)) for k in ks)
    allowed = [c for c in cands if c.allowed]
    feasible = [c for c in allowed if c.feasible]
    overloaded = not feasible
    if feasible:
        best = max(feasible, key=lambda c: (c.goodput_tok_s, -c.k))
    else:
        best = min(allowed, key=lambda c: (c.tpot_s, c.k))
    current = next(c for c in cands if c.k == min(est.k_current, est.k_max))
    gain = best.goodput_tok_s / current.goodput_tok_s - 1 if current.goodput_tok_s > 0 else 0.0
    if risk is Risk.NONE and not current.feasible and best.feasible:
        risk, risk_text = Risk.SLA, f"TPOT at k={current.k} {current.tpot_s * 1e3:.1f} ms misses the target"
    return Decision(
        worker_id=est.worker_id,
        k=best.k,
        candidates=cands,
        overloaded=overloaded,
        risk=risk,
        gain=gain,
        reason=_reason(est, best, current, gain, overloaded, risk_text, tpot_target_s),
    )


def _reason(
    est: Estimate,
    best: Candidate,
    current: Candidate,
    gain: float,
    overloaded: bool,
    risk_text: str,
    target: float | None,
) -> str:
    parts = [f"k={best.k}: goodput {best.goodput_tok_s:.0f} tok/s ({gain:+.0%} vs k={current.k})"]
    target_text = f"target {target * 1e3:.0f} ms" if target is not None else "no TPOT target"
    verdict = "no k meets the target: max per-user speed, overloaded" if overloaded else target_text
    parts.append(f"TPOT {best.tpot_s * 1e3:.1f} ms ({verdict})")
    parts.append(f"B={est.batch:.1f}, AL={best.accepted_length:.2f}")
    if est.drafts_seen <= 0:
        parts.append("no drafts seen yet: acceptance from the profile prior")
    elif est.observed_positions < best.k:
        parts.append(f"positions ≥ {est.observed_positions} from the shifted prior")
    if risk_text:
        parts.append(risk_text)
    return "; ".join(parts)
