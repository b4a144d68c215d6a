"""DSpark adaptive verification in the simulated engine: calibrated confidence, load-aware verified lengths,
counters, and the gauge that tells a controller the engine adapts by itself."""

from __future__ import annotations

import random

from fleet.clock import ManualClock
from fleet.perf import StepShape, expected_tokens_per_step, load_profile
from fleet.scrape import parse_worker_metrics
from workers.sim.adaptive import AdaptiveVerification, AdaptiveVerifier, probits
from workers.sim.arrivals import Lengths, RequestKind, WorkloadMix, closed_loop
from workers.sim.settings import SimWorkerSettings
from workers.sim.virtual import VirtualLab, VirtualWorker, make_worker
from workers.sim.worker import SimWorker

MI355X = load_profile("kimi-k3-dspark-mi355x-tp8")
RANDOM = WorkloadMix((RequestKind("random", Lengths(1024), Lengths(128)),))


def _run(concurrency: int, *, k: int, adaptive: bool, seconds: float = 30.0) -> tuple[VirtualWorker, float]:
    clock = ManualClock()
    worker = make_worker(MI355X, "w0", clock, k=k, max_num_seqs=128, adaptive_verification=adaptive, seed=3)
    lab = VirtualLab([worker], closed_loop(concurrency, RANDOM), clock=clock, seed=4)
    records = lab.run(seconds)
    return worker, records.throughput(5.0, seconds)


def test_verifying_everything_accepts_at_the_profiles_rate() -> None:
    """With a threshold of ~0 every drafted slot is verified, and acceptance follows p exactly."""
    verifier = AdaptiveVerifier(MI355X, AdaptiveVerification(confidence_noise=1.0), rate_tok_s=1e-12)
    probs = (0.7,) * 7
    rng = random.Random(1)
    accepted = 0
    trials = 4000
    for _ in range(trials):
        verifier.rate_tok_s = 1e-12
        plan = verifier.plan([probits(probs)], [7], StepShape(1, 7, 2000), rng)
        assert plan.verified == [7]
        accepted += plan.accepted[0]
    assert abs(accepted / trials - (expected_tokens_per_step(probs, 7) - 1)) < 0.08


def test_an_informative_head_keeps_the_tokens_and_drops_the_slots() -> None:
    """At a high threshold, a sharp head (σ small) verifies fewer slots per accepted token than a vague one."""
    shape = StepShape(64, 7, 64 * 2000)
    mus = [probits((0.6,) * 7)] * 64

    def waste(noise: float) -> float:
        verifier = AdaptiveVerifier(MI355X, AdaptiveVerification(confidence_noise=noise))
        rng = random.Random(2)
        verified = accepted = 0
        for _ in range(200):
            plan = verifier.plan(mus, [7] * 64, shape, rng)
            verified += sum(plan.verified)
            accepted += sum(plan.accepted)
        return (verified - accepted) / max(accepted, 1)

    assert waste(0.3) < waste(3.0)


def test_the_engine_verifies_less_as_the_batch_grows() -> None:
    light, _ = _run(1, k=7, adaptive=True)
    heavy, _ = _run(64, k=7, adaptive=True)
    per_draft = [w.stats.num_draft_tokens / w.stats.num_drafts for w in (light, heavy)]
    assert per_draft[0] > per_draft[1] + 1.0
    for w in (light, heavy):
        st = w.stats
        assert st.num_draft_tokens <= 7 * st.num_drafts
        assert st.num_accepted_tokens == sum(st.accepted_per_pos)


def test_adaptive_beats_every_fixed_k_where_the_best_k_is_in_between() -> None:
    _, adaptive = _run(32, k=7, adaptive=True)
    fixed = [_run(32, k=k, adaptive=False)[1] for k in (0, 3, 7)]
    assert adaptive > max(fixed)


def test_the_cap_still_binds_and_cap_zero_turns_the_drafter_off() -> None:
    capped, _ = _run(4, k=2, adaptive=True)
    assert capped.stats.num_draft_tokens <= 2 * capped.stats.num_drafts
    off, _ = _run(4, k=0, adaptive=True)
    assert off.stats.num_drafts == 0
    tax = MI355X.drafter.k0_tax
    assert tax is not None
    # no drafter pass at cap 0: only the idle-drafter tax of a worker started with its drafter
    assert 0 < off.stats.drafter_s <= tax.at_high_batch * off.stats.target_s


def test_same_seed_same_run() -> None:
    a, ta = _run(8, k=7, adaptive=True, seconds=10.0)
    b, tb = _run(8, k=7, adaptive=True, seconds=10.0)
    assert ta == tb
    assert a.stats.num_draft_tokens == b.stats.num_draft_tokens


def test_the_worker_advertises_adaptive_verification_in_its_metrics() -> None:
    clock = ManualClock()
    adaptive = make_worker(MI355X, "a", clock, adaptive_verification=True)
    fixed = make_worker(MI355X, "f", clock)
    assert parse_worker_metrics(adaptive.metrics_text().decode()).adaptive_verification is True
    assert parse_worker_metrics(fixed.metrics_text().decode()).adaptive_verification is False
    assert parse_worker_metrics("vllm:num_requests_running 0\n").adaptive_verification is None


def test_the_setting_reaches_the_served_worker() -> None:
    worker = SimWorker(SimWorkerSettings(adaptive_verification=True), clock=ManualClock())
    assert worker.engine.adaptive is not None
    assert parse_worker_metrics(worker.metrics.render().decode()).adaptive_verification is True
