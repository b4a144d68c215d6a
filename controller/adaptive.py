"""The controller beside an engine that adapts its own verification (DSpark adaptive verification).

A worker that exports ``gearshift_worker_adaptive_verification 1`` chooses per step how many of the drafted
tokens to verify, from its confidence head and a step-cost model profiled at start-up; the schedule's k is then
only a cap (what the drafter proposes and KV lookahead reserves). The controller does not fight it:

- it predicts the step time of such a worker at the mean verified length
  (``controller.estimator.predict_adaptive_step``), so the online correction learns the engine's speed, not the
  gap between the cap and what the engine verified;
- it chooses between two caps only, k_max (the engine adapts freely) and 0 (drafter off), plus the lower caps
  that KV pressure or preemptions force (``cap_decision``). At a positive cap it compares the goodput it
  *observes* (batch × tokens per request-step / step time, which already includes the engine's choices and the
  confidence head's cost) with the profiled goodput at k = 0; at k = 0 it uses the fixed-k predictions (a lower
  bound of what the engine would do with the freedom) and the stabiliser's periodic probe to measure again;
- it never reads a low accepted length as an acceptance collapse: at a high load the engine verifying little is
  its choice, and whether that still beats k = 0 is the comparison above;
- at the cap k_max it never probes (there is nothing above it to observe).

Where this still adds value over the engine alone: the engine cannot skip the drafter and the confidence head,
which it needs in order to choose, so where speculation does not pay even at its best per-step choice only a cap
of 0 recovers k = 0's goodput; lower caps under KV pressure; and the safety paths (stale metrics, leases).
"""

from __future__ import annotations

from controller.estimator import Estimate
from controller.policy import Decision, Risk


def observed_goodput(est: Estimate) -> float | None:
    """Tokens/s the worker delivered in its last window: batch × tokens per request-step / step time (None: no
    busy window with drafts)."""
    if est.accepted_length is None or est.step_observed_s is None or est.step_observed_s <= 0:
        return None
    return max(est.batch, 1.0) * est.accepted_length / est.step_observed_s


def cap_decision(est: Estimate, decision: Decision) -> Decision:
    """Turn the fixed-k ``decision`` into a cap for an adaptive engine (see the module docstring)."""
    if decision.risk in (Risk.KV, Risk.PREEMPTION):
        return decision  # lower caps shrink the KV lookahead the engine reserves
    k0 = decision.candidate(0)
    if k0 is None:
        return decision
    best_fixed = max(decision.candidates, key=lambda c: (c.goodput_tok_s, -c.k))
    observed = observed_goodput(est) if est.k_current > 0 else None
    if est.k_current == 0:
        current, free = k0.goodput_tok_s, best_fixed.goodput_tok_s
    else:
        at_cap = decision.candidate(est.k_current)
        current = observed if observed is not None else (at_cap or best_fixed).goodput_tok_s
        free = observed if observed is not None and est.k_current >= est.k_max else best_fixed.goodput_tok_s
    if k0.goodput_tok_s >= free:
        k, value, why = 0, k0.goodput_tok_s, "adaptive engine: drafter off beats its best per-step choice"
    else:
        k, value, why = est.k_max, free, "adaptive engine: cap k_max, the engine sizes verification per step"
    seen = f"observed {observed:.0f} tok/s at cap {est.k_current}" if observed is not None else "no observation"
    return Decision(
        worker_id=decision.worker_id,
        k=k,
        candidates=decision.candidates,
        overloaded=decision.overloaded,
        risk=Risk.NONE,
        gain=value / current - 1 if current > 0 else 0.0,
        reason=(
            f"{why}: {seen}, k=0 predicted {k0.goodput_tok_s:.0f} tok/s, best fixed k={best_fixed.k} "
            f"{best_fixed.goodput_tok_s:.0f} tok/s"
        ),
    )
