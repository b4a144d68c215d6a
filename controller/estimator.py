"""Per-worker estimator: smooths what the windows show (STYLE 8: the estimator smooths).

- **Acceptance**: exponentially weighted sums of drafts and accepted tokens per draft position, so
  ``a_i = accepted_i / drafts_i`` and the conditional ``p_i = a_i / a_{i-1}``. Positions the worker has not
  drafted (at or above the k in force) keep what was last seen for ``position_max_age`` windows, then count as
  unobserved; positions unobserved use the profile's prior,
  shifted by how the observed positions compare with their prior (in rejection-odds: ``1 − p`` scaled by the
  mean observed ``(1 − p̂)/(1 − prior)``), and every position is shrunk toward that prior with a pseudo-count.
- **Load**: mean decode batch per step from counters (never the instantaneous gauge, vLLM #49548), queue,
  KV usage, preemption rate, context per sequence (KV in use / running), and prompt tokens per output token
  (a property of the workload: the prefill work a step carries grows with the tokens it emits, so a higher k
  that finishes requests in fewer steps also brings their successors' prompts sooner).
- **Step time**: a multiplicative correction of the profile's step time, EWMA of observed/predicted over busy
  windows; also one per k and batch band (``step_correction_by_k``, ``batch_band``), forgotten
  ``correction_max_age`` windows after that k last ran there, a k not measured taking the nearest measured k's:
  a profile whose shape in (B, k) is wrong (the other profile of the family) needs a different factor at each k,
  which one scalar learned at the current k cannot give. The observed step time is window length / engine steps
  (the count of ``vllm:iteration_tokens_total``) — vLLM exports no busy-time counter, so windows with idle time
  are skipped. On a worker that adapts its verification (``adaptive``), the prediction is at the
  mean verified length (``predict_adaptive_step``), not at the cap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from controller.classes import fit_mix
from controller.window import Window
from fleet.perf import Profile, StepTime, conditional_acceptance, predict_step


class EstimatorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    alpha: float = Field(0.3, gt=0, le=1)
    """Weight of the newest window in every EWMA."""
    prior_drafts: float = Field(50.0, ge=0)
    """Pseudo-count of drafts behind the prior at each position (shrinkage strength)."""
    min_drafts: float = Field(20.0, ge=0)
    """Drafts a position needs before it counts as observed."""
    position_max_age: int = Field(15, ge=1)
    """Windows after which a position not drafted since (at or above the k in force) counts as unobserved and
    follows the shifted prior, so a workload shift seen at the low positions reaches the high ones."""
    correction_max_age: int = Field(60, ge=1)
    """Windows a k's own step-time correction is kept after that k last ran: long enough to outlast the interval
    between neighbour probes (``StabiliserConfig.neighbour_probe_s``), which measure it."""
    steady_batch_change: float = Field(0.2, ge=0)
    """A window's step time counts as evidence about its k at its batch band (``step_correction_by_k``) only when
    its decode batch is within this fraction of the window before's: on a load step a burst of prompts lands on
    a batch still filling, and a gear measured then would stand against one measured in steady state."""
    correction_bounds: tuple[float, float] = (0.05, 20.0)
    """Clamp of the step-time correction (wide enough for simulated workers running up to 20× real time)."""


@dataclass(frozen=True, slots=True)
class Estimate:
    """Everything the policy needs about one worker. Times in seconds, rates per second, fractions 0…1."""

    worker_id: str
    k_current: int
    k_max: int
    conditional: tuple[float, ...]
    """Estimated P(draft i accepted | 0…i−1 accepted), i = 0…k_max−1 (observed, shrunk, or prior)."""
    observed_positions: int = 0
    """Leading positions with at least ``min_drafts`` smoothed drafts behind them."""
    drafts_seen: float = 0.0
    batch: float = 0.0
    """Mean decoding sequences per step."""
    batch_ahead: float = 0.0
    """The batch the worker is heading for: the last window's decode batch plus its waiting requests, up to its
    largest batch and to what its KV cache holds at the current context (0: unknown). Above ``batch`` while a
    queue is being admitted, as on a load step, where the smoothed batch trails by several windows."""
    context_per_seq: float = 0.0
    prefill_per_token: float = 0.0
    """Prompt tokens prefilled per output token generated (workload mix), tokens/token."""
    waiting: float = 0.0
    kv_usage: float = 0.0
    preemption_rate: float = 0.0
    step_correction: float = 1.0
    step_observed_s: float | None = None
    accepted_length: float | None = None
    """Observed mean tokens per decoding request-step at ``k_current`` (None when nothing was drafted)."""
    windows: int = 0
    stale: bool = False
    stale_for_s: float = 0.0
    class_mix: tuple[tuple[str, float], ...] = ()
    """The profile's workload classes that best explain the observed per-position acceptance, with their share of
    request-steps (``controller.classes``); empty before any drafts."""
    adaptive: bool = False
    """The worker's engine chooses per step how many drafts to verify (``k_current`` is a cap)."""
    verified_per_draft: float | None = None
    """Mean drafts verified per drafting request-step in the last window (None without drafts)."""
    fresh_gears: tuple[int, ...] = ()
    """The k that ran at the current ``batch_band`` in the last ``position_max_age`` windows."""
    step_correction_by_k: tuple[tuple[int, float], ...] = ()
    """``(k, correction)`` for the k that ran at the current ``batch_band`` in the last ``correction_max_age``
    windows."""
    max_num_seqs: int | None = None
    """The worker's largest batch (None: unknown)."""

    def correction_for(self, k: int) -> float:
        """The step-time correction at draft length ``k``: its own if it ran recently, else that of the nearest k
        that did (the lower on a tie), else ``step_correction``. A profile whose shape in k is wrong is corrected
        by what the nearest measured gear shows, not by the factor learned at a gear far away (issue 25: learned
        at k = 0 and carried to every k > 0, it kept a model that overstates the drafter's cost from ever
        predicting a k > 0 that pays)."""
        if not self.step_correction_by_k:
            return self.step_correction
        return min(self.step_correction_by_k, key=lambda kc: (abs(kc[0] - k), kc[0]))[1]

    def observed_gear(self, k: int) -> bool:
        """Whether ``k`` ran at this batch band in the last ``position_max_age`` windows (its step time is fresh
        evidence, not a memory to be re-measured): the evidence the policy may leave the tuned table's gear on.
        An older measurement is not compared with a fresh one: taken on a load step (a burst of prompts, a batch
        still filling) it would stand against one taken in steady state."""
        return k in self.fresh_gears


def predict_adaptive_step(
    profile: Profile,
    *,
    batch: float,
    cap: int,
    verified: float,
    context_per_seq: float,
    prefill_per_step: float = 0.0,
) -> StepTime:
    """Profiled step time of an adaptive step, seconds: the target at ``verified`` drafts per sequence (linear
    between the integer draft lengths on either side), the drafter at the ``cap`` it drafted."""
    verified = min(max(verified, 0.0), float(cap))
    lo = math.floor(verified)
    frac = verified - lo

    def at(k: int) -> StepTime:
        return predict_step(
            profile, batch=batch, k=k, context_per_seq=context_per_seq, prefill_per_step=prefill_per_step
        )

    low = at(lo)
    target = low.target_s if frac <= 0 else low.target_s + frac * (at(lo + 1).target_s - low.target_s)
    return StepTime(target_s=target, drafter_s=at(cap).drafter_s)


def batch_band(batch: float) -> int:
    """The half-octave of a mean decode batch (…, 45-64 → 12, 64-90 → 13, …): a k's step-time correction is kept
    per band, since a profile's error in the drafter's cost need not be the same at batch 8 as at 512."""
    return round(2 * math.log2(max(batch, 1.0)))


def _ewma(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new


@dataclass
class WorkerEstimator:
    """Smoothed state of one worker, fed one ``Window`` per tick."""

    worker_id: str
    profile: Profile
    k_max: int
    config: EstimatorConfig = field(default_factory=EstimatorConfig)
    prior_workload: str | None = None
    drafts_at: list[float] = field(default_factory=list)
    accepted_at: list[float] = field(default_factory=list)
    seen_at: list[int] = field(default_factory=list)
    """Per position, the window count when it was last drafted."""
    batch: float | None = None
    batch_ahead: float = 0.0
    max_num_seqs: int | None = None
    """The worker's largest batch (set by the loop from its start-up schedule; None: unknown, no cap)."""
    context_per_seq: float | None = None
    prefill_per_token: float | None = None
    waiting: float | None = None
    preemption_rate: float | None = None
    correction: float | None = None
    kv_usage: float = 0.0
    k_current: int = 0
    step_observed_s: float | None = None
    accepted_length: float | None = None
    windows: int = 0
    adaptive: bool = False
    """Set by the loop from the worker's ``gearshift_worker_adaptive_verification`` gauge."""
    verified_per_draft: float | None = None
    last_decode_batch: float | None = None
    """The decode batch of the last window with engine steps."""
    correction_by_k: dict[tuple[int, int], tuple[float, int]] = field(default_factory=dict)
    """(k, ``batch_band``) → (EWMA of observed/predicted step time at that k and batch, the window count when it
    last ran there)."""

    def __post_init__(self) -> None:
        self.drafts_at = self.drafts_at or [0.0] * self.k_max
        self.accepted_at = self.accepted_at or [0.0] * self.k_max
        self.seen_at = self.seen_at or [0] * self.k_max

    def update(self, w: Window) -> None:
        """Fold one window into the smoothed state."""
        a = self.config.alpha
        self.windows += 1
        self.k_current = w.k
        self.kv_usage = w.kv_usage
        self.waiting = _ewma(self.waiting, w.waiting, a)
        self.preemption_rate = _ewma(self.preemption_rate, w.preemptions / w.duration_s, a)
        if w.steps > 0:
            self.batch = _ewma(self.batch, w.decode_batch, a)
            self.batch_ahead = self._ahead(w)
        if w.generation_tokens > 0:
            self.prefill_per_token = _ewma(self.prefill_per_token, w.prompt_tokens / w.generation_tokens, a)
        if w.running > 0:
            ctx = w.kv_usage * self.profile.hardware.kv_capacity_tokens / w.running
            self.context_per_seq = _ewma(self.context_per_seq, ctx, a)
        self.accepted_length = w.accepted_length
        self.verified_per_draft = w.draft_tokens / w.drafts if w.drafts > 0 else None
        if w.k > 0 and w.drafts > 0:
            for i in range(min(w.k, self.k_max)):
                acc = w.accepted_per_pos[i] if i < len(w.accepted_per_pos) else 0.0
                self.drafts_at[i] = (1 - a) * self.drafts_at[i] + w.drafts
                self.accepted_at[i] = (1 - a) * self.accepted_at[i] + acc
                self.seen_at[i] = self.windows
        self._update_correction(w)

    def _update_correction(self, w: Window) -> None:
        observed = w.step_s
        self.step_observed_s = observed
        if observed is None or w.steps <= 0:
            return
        predicted = self._predicted_adaptive_s(w)
        if predicted is None:
            predicted = predict_step(
                self.profile,
                batch=w.decode_batch,
                k=w.k,
                context_per_seq=self.context_per_seq or 0.0,
                prefill_per_step=w.prompt_tokens / w.steps,
                drafter_loaded=True,  # as the policy predicts: every worker it shifts was started with its drafter
            ).total_s
        if predicted <= 0:
            return
        lo, hi = self.config.correction_bounds
        ratio = min(max(observed / predicted, lo), hi)
        self.correction = _ewma(self.correction, ratio, self.config.alpha)
        last = self.last_decode_batch
        steady = last is None or abs(w.decode_batch - last) <= self.config.steady_batch_change * max(last, 1.0)
        self.last_decode_batch = w.decode_batch
        if not steady:
            return  # a batch still filling or draining: its step time is no evidence about this gear at this batch
        key = (w.k, batch_band(w.decode_batch))
        old = self.correction_by_k.get(key)
        if old is not None and self.windows - 1 - old[1] > self.config.position_max_age:
            old = None  # a memory older than fresh evidence (a ramp's windows, say) is replaced, not averaged in
        self.correction_by_k[key] = (_ewma(old[0] if old else None, ratio, self.config.alpha), self.windows)

    def _predicted_adaptive_s(self, w: Window) -> float | None:
        """The profiled step time of an adaptive window, at its mean verified length (None: not adaptive)."""
        if not self.adaptive or w.k <= 0 or self.verified_per_draft is None:
            return None
        return predict_adaptive_step(
            self.profile,
            batch=w.decode_batch,
            cap=w.k,
            verified=self.verified_per_draft,
            context_per_seq=self.context_per_seq or 0.0,
            prefill_per_step=w.prompt_tokens / w.steps,
        ).total_s

    def prior(self) -> tuple[float, ...]:
        workload = self.prior_workload or self.profile.default_workload
        return conditional_acceptance(self.profile, workload, self.context_per_seq or 0.0)[: self.k_max]

    def conditional(self) -> tuple[tuple[float, ...], int]:
        """Estimated conditional acceptance per position and the number of observed leading positions."""
        prior = self.prior()
        cfg = self.config
        raw: list[float] = []
        prev_a = 1.0
        for d, acc, seen in zip(self.drafts_at, self.accepted_at, self.seen_at, strict=True):
            if d < cfg.min_drafts or prev_a <= 0 or self.windows - seen > cfg.position_max_age:
                break
            a_i = acc / d
            raw.append(min(a_i / prev_a, 1.0))
            prev_a = a_i
        observed = len(raw)
        odds = [(1 - p) / max(1 - q, 1e-6) for p, q in zip(raw, prior, strict=False)]
        scale = sum(odds) / len(odds) if odds else 1.0
        out = []
        for i, q in enumerate(prior):
            shifted = min(max(1 - (1 - q) * scale, 0.0), 0.99)
            if i < observed:
                n = self.drafts_at[i]
                out.append((n * raw[i] + cfg.prior_drafts * shifted) / (n + cfg.prior_drafts))
            else:
                out.append(shifted)
        return tuple(out), observed

    def _ahead(self, w: Window) -> float:
        """``Estimate.batch_ahead`` after window ``w``."""
        ahead = w.decode_batch + w.waiting
        if self.max_num_seqs is not None:
            ahead = min(ahead, float(self.max_num_seqs))
        if w.kv_usage > 0:
            ahead = min(ahead, w.decode_batch / w.kv_usage)  # the sequences the KV cache holds at this context
        return max(ahead, w.decode_batch)

    def estimate(self, *, stale: bool = False, stale_for_s: float = 0.0) -> Estimate:
        conditional, observed = self.conditional()
        band = batch_band(self.batch or 0.0)
        return Estimate(
            worker_id=self.worker_id,
            k_current=self.k_current,
            k_max=self.k_max,
            conditional=conditional,
            observed_positions=observed,
            drafts_seen=self.drafts_at[0] if self.drafts_at else 0.0,
            batch=self.batch or 0.0,
            batch_ahead=self.batch_ahead,
            context_per_seq=self.context_per_seq or 0.0,
            prefill_per_token=self.prefill_per_token or 0.0,
            waiting=self.waiting or 0.0,
            kv_usage=self.kv_usage,
            preemption_rate=self.preemption_rate or 0.0,
            step_correction=self.correction or 1.0,
            step_observed_s=self.step_observed_s,
            accepted_length=self.accepted_length,
            windows=self.windows,
            stale=stale,
            stale_for_s=stale_for_s,
            class_mix=self.class_mix(),
            adaptive=self.adaptive,
            verified_per_draft=self.verified_per_draft,
            fresh_gears=tuple(
                sorted(
                    k
                    for (k, b), (_, seen) in self.correction_by_k.items()
                    if b == band and self.windows - seen <= self.config.position_max_age
                )
            ),
            step_correction_by_k=tuple(
                sorted(
                    (k, c)
                    for (k, b), (c, seen) in self.correction_by_k.items()
                    if b == band and self.windows - seen <= self.config.correction_max_age
                )
            ),
            max_num_seqs=self.max_num_seqs,
        )

    def class_mix(self) -> tuple[tuple[str, float], ...]:
        """The fitted mix of workload classes (``controller.classes.fit_mix``) over the observed positions."""
        observed = [
            (acc / d, d) for d, acc in zip(self.drafts_at, self.accepted_at, strict=True) if d >= self.config.min_drafts
        ]
        return fit_mix(self.profile, observed, self.context_per_seq or 0.0)
