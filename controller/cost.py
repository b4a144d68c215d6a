"""The cost-per-token model (DESIGN §5). What is measured and what is modelled:

Per worker and window (measured): the worker costs ``usd_per_s = GPUs × $/GPU-hour / 3600`` for the whole
window, busy or idle, so ``$/Mtok = usd_per_s × window / output tokens × 1e6``.

Split (modelled from the corrected profile at the window's mean decode batch and k):

- *drafter share* = steps × drafter time per step × usd_per_s / window cost (at k = 0 the drafter time is the
  profile's idle-drafter tax, ``fleet.perf.IdleDrafterTax``: a worker started with a drafter pays for it even
  when it drafts nothing);
- *rejected-draft share* = steps × (target time at k − target time at k=0) × rejected fraction × usd_per_s /
  window cost, where the rejected fraction ``(draft tokens − accepted)/draft tokens`` is measured: the extra
  verification work a step does for its k drafts, in the proportion of them that was thrown away;
- *counterfactual k=0*: the same output tokens at the same mean batch need ``tokens / B`` steps of the k=0 step
  time; idle time is kept and the busy time (modelled, at most the window) is scaled by the modelled ratio
  ``(tokens / B × T(B, 0)) / (steps × T(B, k))`` (a ratio, so a model that over- or under-predicts the step time
  cannot invent savings: at k=0 the ratio is 1 and the counterfactual is the actual cost), so
  ``savings = cost at k=0 − cost`` (negative when speculation cost more than it saved). That k=0 is this worker's
  own (drafter loaded, tax paid: what the controller can choose without a restart);
- *counterfactual drafter-free* (``usd_off``): the same, scaled by the time of k = 0 on a worker started without
  the drafter (no tax), which only a restart reaches.

Per tenant (``attribute_to_tenants``): each worker's cost over a period is split over the requests that ran on
it in proportion to the batch-slot time they held — decode time ``TPOT × (output tokens − 1)`` plus prompt
tokens × the modelled prefill seconds per token — because a decoding sequence costs its share of a step
whatever its acceptance, and idle capacity is paid for by the work that was there.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controller.policy import Candidate
from controller.window import Window
from fleet.perf import Profile, StepShape, step_time
from fleet.store.protocol import UsageRecord

_PREFILL_PROBE_TOKENS = 4096


@dataclass(frozen=True, slots=True)
class WorkerCost:
    """One worker's cost over one window. USD, seconds, tokens; shares are fractions of ``usd``."""

    window_s: float
    usd: float
    output_tokens: float
    drafter_share: float
    rejected_share: float
    usd_k0: float
    """Modelled cost of the same output at k = 0 on this worker (drafter loaded, idle-drafter tax paid)."""
    usd_off: float | None = None
    """Modelled cost of the same output on a worker started without the drafter (None: not modelled)."""

    @property
    def usd_per_mtok(self) -> float | None:
        return self.usd / self.output_tokens * 1e6 if self.output_tokens > 0 else None

    @property
    def usd_per_mtok_k0(self) -> float | None:
        return self.usd_k0 / self.output_tokens * 1e6 if self.output_tokens > 0 else None

    @property
    def usd_per_mtok_off(self) -> float | None:
        if self.usd_off is None or self.output_tokens <= 0:
            return None
        return self.usd_off / self.output_tokens * 1e6

    @property
    def savings_usd(self) -> float:
        """Modelled cost at k=0 minus the actual cost, USD (negative: speculation cost money)."""
        return self.usd_k0 - self.usd


def worker_cost(
    *, usd_per_s: float, window: Window, current: Candidate, k0: Candidate, off: Candidate | None = None
) -> WorkerCost:
    """Cost of ``window``; ``current``, ``k0`` and ``off`` are the policy's predictions at the window's k, at
    k=0 on this worker and at k=0 on a worker started without the drafter."""
    usd = usd_per_s * window.duration_s
    busy = min(window.duration_s, window.steps * current.step_s)
    drafter_usd = usd_per_s * window.steps * current.drafter_s
    rejected_frac = (window.draft_tokens - window.accepted) / window.draft_tokens if window.draft_tokens > 0 else 0.0
    extra_verify_s = max(current.target_s - k0.target_s, 0.0)
    rejected_usd = usd_per_s * window.steps * extra_verify_s * rejected_frac
    usd_k0 = usd_per_s * (window.duration_s - busy + busy * _k0_time_ratio(window, current, k0))
    usd_off = None
    if off is not None:
        off_ratio = _k0_time_ratio(window, current, k0) * (off.step_s / k0.step_s if k0.step_s > 0 else 1.0)
        usd_off = usd_per_s * (window.duration_s - busy + busy * off_ratio)
    return WorkerCost(
        window_s=window.duration_s,
        usd=usd,
        output_tokens=window.generation_tokens,
        drafter_share=min(drafter_usd / usd, 1.0) if usd > 0 else 0.0,
        rejected_share=min(rejected_usd / usd, 1.0) if usd > 0 else 0.0,
        usd_k0=usd_k0,
        usd_off=usd_off,
    )


def _k0_time_ratio(window: Window, current: Candidate, k0: Candidate) -> float:
    """Modelled busy time at k=0 over modelled busy time at the window's k, for the window's output tokens.

    A ratio of two modelled times, so that it applies to the busy time however the model errs (it may
    over- or under-predict): at k=0 it is exactly 1 and the counterfactual equals the actual cost."""
    batch = window.decode_batch
    modelled = window.steps * current.step_s
    if window.k == 0 or batch <= 0 or modelled <= 0:
        return 1.0
    return window.generation_tokens / batch * k0.step_s / modelled


def prefill_seconds_per_token(profile: Profile) -> float:
    """Modelled engine seconds per prompt token: a full chunked-prefill step divided by its tokens."""
    tokens = min(profile.chunked_prefill_tokens, _PREFILL_PROBE_TOKENS)
    return step_time(profile, StepShape(0, 0, 0, tokens)).total_s / tokens


def profile_tpot_s(profile: Profile) -> float:
    """Modelled seconds per output token of one stream without speculation (the profile's k = 0 step at batch 1):
    the TPOT a request is weighed with when neither it nor its worker's controller measured one."""
    return step_time(profile, StepShape(1, 0, 0)).total_s


def request_weight(record: UsageRecord, *, prefill_s_per_token: float, fallback_tpot_s: float) -> float:
    """Batch-slot seconds one request held: decode time plus modelled prefill time."""
    tpot = record.tpot_s if record.tpot_s is not None else fallback_tpot_s
    return tpot * max(record.completion_tokens - 1, 0) + record.prompt_tokens * prefill_s_per_token


def attribute_to_tenants(
    records: Iterable[UsageRecord],
    worker_usd: Mapping[str, float],
    *,
    prefill_s_per_token: Mapping[str, float],
    fallback_tpot_s: Mapping[str, float],
) -> dict[str, float]:
    """Split each worker's cost (USD over a period) over the tenants whose requests ran on it, by slot time.
    ``prefill_s_per_token`` and ``fallback_tpot_s`` (seconds) are per worker id, from each worker's own profile
    (``prefill_seconds_per_token``, ``profile_tpot_s``): a mixed fleet weighs each worker's work its own way.

    Records without a worker, or on a worker with no cost figure, are skipped; a worker with no records keeps
    its cost unattributed (it is idle capacity nobody used)."""
    weights: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for rec in records:
        if rec.worker_id is None or rec.worker_id not in worker_usd:
            continue
        wid = rec.worker_id
        w = request_weight(rec, prefill_s_per_token=prefill_s_per_token[wid], fallback_tpot_s=fallback_tpot_s[wid])
        weights[rec.worker_id][rec.tenant] += w
    out: dict[str, float] = defaultdict(float)
    for worker_id, by_tenant in weights.items():
        total = sum(by_tenant.values())
        if total <= 0:
            continue
        for tenant, w in by_tenant.items():
            out[tenant] += worker_usd[worker_id] * w / total
    return dict(out)
