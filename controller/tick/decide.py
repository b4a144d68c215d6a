"""Stage 2, decide: the policy's k for the worker from this tick's estimate (``controller.policy.decide``, a pure
function), turned into a cap when the worker's engine sizes its own verification (``controller.adaptive``)."""

from __future__ import annotations

from controller.adaptive import cap_decision
from controller.estimator import Estimate
from controller.policy import Decision, PolicyConfig, decide
from controller.runtime import WorkerRuntime


def decide_worker(
    rt: WorkerRuntime,
    est: Estimate,
    *,
    config: PolicyConfig,
    tpot_target_s: float | None,
    drafter_loaded: bool,
) -> Decision:
    """The worker's decision this tick, against ``tpot_target_s`` (seconds; its pool's or its model's tiers')."""
    if drafter_loaded != rt.drafter_loaded:
        rt.drafter_loaded, rt.stab = drafter_loaded, None  # restarted in the other mode: start from what it runs
    decision = decide(
        est,
        rt.profile,
        tpot_target_s=tpot_target_s,
        ttft_target_s=rt.ttft_target_s,
        config=config,
        full_speed=rt.full_speed if drafter_loaded else None,  # drafter-free: would a k > 0 pay with the drafter?
        drafter_loaded=drafter_loaded,
    )
    if est.adaptive:
        decision = cap_decision(est, decision)  # the engine sizes verification itself: choose its cap
    return decision
