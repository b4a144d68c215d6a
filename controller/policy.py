"""The policy: a pure function from one worker's estimate to the k it should run (STYLE 8).

For every candidate k in the tier set (≤ the worker's k_max) it predicts the mean tokens per request-step
``AL(k) = fleet.perf.expected_tokens_per_step(conditional, k)`` and the step time
``T(B, k) = fleet.perf.step_time × correction`` (that k's own where it ran recently,
``Estimate.correction_for``) at the mean decode batch B, carrying the prefill that comes with
the tokens it emits (prompt tokens per output token × B × AL(k)), hence goodput ``B·AL/T`` (tokens/s) and TPOT
``T/AL`` (seconds). It picks the k with the highest goodput among those whose TPOT meets the target of
the tiers the worker serves; if none does, the k with the lowest TPOT (the most goodput within
``overload_tpot_tolerance`` of it), flagged ``overloaded``. The TPOT checked is that of the slowest workload
class with a material share of the worker's traffic (``controller.classes``), not the blended mean: a chat
request sharing a batch with maths sees the same step time but far fewer accepted tokens per step.

TTFT targets count too (issue 16): a k's verified tokens, ``B·(k + 1)`` per step, share the step's token budget
(``chunked_prefill_tokens``) with the prompts being prefilled, and lengthen every step. So a new request behind
the W waiting ones, all of the mean prompt length P (``mean_prompt_tokens``), has its first token after
``(W + 1)·P / (budget − B·(k + 1))`` steps of ``T(B, k)`` carrying a full prefill chunk: its predicted TTFT
``ttft_s``, the part of TTFT that k moves. At the worker's batch limit (``max_num_seqs``) the requests beyond the
free slots wait for running ones to finish, at the completion rate ``B·AL(k) / (T(B, k)·O)``, which the gear with
the most goodput raises most. Among the k that meet the TPOT target, those whose ``ttft_s`` also meets the
tightest ``ttft_target_s`` of the worker's tiers are preferred; when no k meets it, k cannot help and the TTFT
target is set aside (the reason says so).

One k per worker, not a per-batch-size table: the decode batch is measured as a mean over a window, and a table
keyed on the instantaneous batch (which includes prefills and flickers) is what collapses throughput at its
threshold in vLLM #49548. At a fixed B the goodput argmax is also the TPOT argmin, so the target mostly decides
``overloaded``; safety caps (KV, preemptions, acceptance collapse) restrict the candidate set first.

Two worker facts shape the candidates (issue 14). The worker's advertised ``full_speed`` set: a k that does not
run at full speed at the expected batch (``controller.full_speed``) is predicted but never chosen, unless no
allowed k does. And the drafter: on a worker started with one, k = 0 pays the profile's idle-drafter tax
(``fleet.perf.IdleDrafterTax``); ``Decision.off`` predicts the same load on a worker started without it.

The tuned table is the starting point (issue 25: never do worse than what an operator already has). The gear vLLM's
``num_speculative_tokens_per_batch_size`` table tuned from the profile for the *observed* mix
(``fleet.fallback.tuned_table``, the tuner of the lab's ``vllm-table``) gives at the expected batch is the default
(``Basis.TABLE``). Among the k that meet the targets, the policy leaves it only on measured evidence: for another
k to be chosen, it and the table's gear must both have had their step time measured at this batch band
(``Estimate.observed_gear``); then the measured k with the most goodput wins (``Basis.MEASURED``). A gear the model
merely predicts to be better is never chosen on that prediction: the stabiliser's bounded neighbour probes
measure it (``controller.stabiliser``), and only then can it be. When the table's gear misses the targets the
model's choice stands (``Basis.MODEL``), as it does on an adaptive worker (the engine explores under its cap) and
with ``start_from_table`` off.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from controller.classes import slowest_al_ratio
from controller.estimator import Estimate
from controller.full_speed import advertised_gears, excluded_reason, expected_batch_size
from fleet.capacity import MixPoint
from fleet.fallback import general_mix, tuned_table
from fleet.perf import Profile, expected_tokens_per_step, predict_step
from fleet.speculation import FullSpeed, Schedule


class PolicyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    k_tiers: tuple[int, ...] | None = None
    """An operator's restriction of the k the controller moves between (None: every gear the worker advertises at
    full speed up to its k_max, ``controller.full_speed.advertised_gears``)."""
    kv_high: float = Field(0.9, gt=0, le=1)
    """KV usage at or above which k must come down (drafts reserve KV lookahead)."""
    preemption_rate_high: float = Field(0.05, ge=0)
    """Preemptions per second above which k must come down."""
    collapse_accepted_length: float = Field(1.15, ge=1)
    """Observed tokens per request-step at the current k below which acceptance has collapsed: k → 0."""
    tpot_margin: float = Field(0.1, ge=0, lt=1)
    """A k above the current one counts as meeting the TPOT target only with this fraction to spare (hysteresis:
    the prediction is noisy, and a k that only just meets the target would be taken down again at once)."""
    overload_tpot_tolerance: float = Field(0.05, ge=0)
    """A k whose slowest-class TPOT is within this fraction of the lowest any k achieves is acceptable even if it
    misses the target (no k would serve that class materially faster, so the other classes need not pay for it),
    and when no k meets the target the choice is the most goodput among those (the TPOT curve is flat near its
    minimum, and its noisy argmin flaps between neighbours)."""
    overload_queue: float = Field(1.0, ge=0)
    """Mean waiting requests at or above which an overloaded worker maximises goodput (drains its queue)
    rather than per-user speed."""
    class_min_share: float = Field(0.1, ge=0, le=1)
    """Share of request-steps a workload class needs in the fitted mix (``controller.classes``) before its own
    TPOT, rather than the blended one, must meet the target."""
    start_from_table: bool = True
    """Start from the tuned table's gear for the observed mix and leave it only on measured evidence
    (``controller.policy``, issue 25); False: the model's choice alone."""


class Basis(StrEnum):
    """What a decision's k rests on."""

    TABLE = "table"
    """The tuned table's gear at this batch, not yet measured here: the default, taken without a predicted gain."""
    TABLE_MEASURED = "table-measured"
    """The tuned table's gear, measured here and no measured gear beats it."""
    MEASURED = "measured"
    """Another gear, measured here with more goodput than the table's gear, measured too."""
    MODEL = "model"
    """The model's prediction (the table's gear misses the targets, an adaptive worker, or the table is off)."""


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
    tpot_slowest_s: float | None = None
    """TPOT of the slowest workload class with a material share of the traffic (None: same as ``tpot_s``)."""
    ttft_s: float | None = None
    """Predicted prefill time of a mean-length prompt at this k, seconds (None: no prompts seen yet)."""
    ttft_ok: bool = True
    """``ttft_s`` meets the TTFT target (True when there is no target or no prediction)."""
    excluded_by: str = ""
    """Why the worker's advertised full-speed set rules this k out at the expected batch ('' when it does not)."""

    @property
    def full_speed(self) -> bool:
        """The worker runs this k at full speed at the expected batch (or advertises no restriction)."""
        return not self.excluded_by

    @property
    def tpot_worst_s(self) -> float:
        """The TPOT the target is checked against, seconds."""
        return self.tpot_slowest_s if self.tpot_slowest_s is not None else self.tpot_s


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
    off: Candidate | None = None
    """k = 0 on a worker started without the drafter (no idle-drafter tax): never chosen here, a restart away."""
    table_k: int | None = None
    """The tuned table's gear at the expected batch for the observed mix, the nearest allowed candidate (None:
    ``start_from_table`` off)."""
    basis: Basis = Basis.MODEL
    tpot_target_s: float | None = None
    """The TPOT target the candidates were checked against, without the margin a move up needs, seconds (None:
    none): what a neighbour probe must keep on average over its interval (``controller.stabiliser``)."""

    def candidate(self, k: int) -> Candidate | None:
        return next((c for c in self.candidates if c.k == k), None)


def mean_prompt_tokens(est: Estimate) -> float:
    """Mean prompt length of the worker's requests, tokens, from what the estimate holds: a running request's
    context averages its prompt P plus half its output O, and prompts are ``r = prefill_per_token`` times the
    output, so ``P = context · r / (r + ½)``. 0 before any prompt was seen."""
    r = est.prefill_per_token
    return est.context_per_seq * r / (r + 0.5) if r > 0 else 0.0


def predict_prefill_s(
    est: Estimate, profile: Profile, k: int, *, drafter_loaded: bool, goodput_tok_s: float | None = None
) -> float | None:
    """Seconds until a new request's first token at draft length ``k``: the prompts of the ``est.waiting``
    requests ahead of it and its own, each of the mean length (``mean_prompt_tokens``), prefilled beside a decode
    batch of ``est.batch``: ``(W + 1)·P / chunk`` steps, each ``T(B, k)`` × correction carrying ``chunk = budget
    − B·(k + 1)`` prompt tokens (at least one token); at the batch limit, the requests beyond the free slots first
    wait for completions (module docstring), ``goodput_tok_s`` / output per second (by default at the step carrying
    the chunk). None before any prompt was seen."""
    prompt = mean_prompt_tokens(est)
    if prompt <= 0:
        return None
    batch = max(est.batch, 1.0)
    chunk = max(profile.chunked_prefill_tokens - batch * (k + 1), 1.0)
    step = predict_step(
        profile,
        batch=batch,
        k=k,
        context_per_seq=est.context_per_seq,
        prefill_per_step=chunk,
        drafter_loaded=drafter_loaded,
    ).total_s * est.correction_for(k)
    ahead = est.waiting + 1.0
    slots = max(est.max_num_seqs - batch, 0.0) if est.max_num_seqs is not None else ahead
    if ahead <= slots:
        return ahead * prompt / chunk * step
    # A full batch admits a waiting request only when a running one finishes: the requests beyond the free slots
    # wait for completions, at B · AL(k) / (T(B, k) · output) per second, then their own prompt's prefill.
    output = prompt / est.prefill_per_token
    if goodput_tok_s is None:
        goodput_tok_s = batch * expected_tokens_per_step(est.conditional, k) / step
    return (ahead - slots) * output / goodput_tok_s + (slots + 1.0) * prompt / chunk * step


_TABLES: dict[tuple[int, tuple[tuple[str, float], ...], float, float, int], tuple[Profile, Schedule]] = {}
"""Tuned tables by (profile id, rounded mix, max_num_seqs), each kept with its profile (an id may be reused)."""
_TABLES_MAX = 512
TABLE_MAX_NUM_SEQS = 256
"""The batch limit a table is tuned to when the worker's own is not known yet."""


def _two_figures(x: float) -> float:
    return float(f"{x:.2g}")


def observed_mix(est: Estimate, profile: Profile) -> MixPoint:
    """The traffic the worker sees, as the table tuner takes it: the fitted class mix (shares rounded to 5 %) and
    the mean prompt and output lengths (two figures), so that estimation noise does not retune the table every
    tick. Before any prompt was seen, the general mix's lengths; before any drafts, the profile's prior class."""
    workloads = tuple((name, round(share * 20) / 20) for name, share in est.class_mix if round(share * 20) > 0)
    workloads = workloads or ((profile.default_workload, 1.0),)
    prompt = mean_prompt_tokens(est)
    if prompt <= 0 or est.prefill_per_token <= 0:
        general = general_mix(profile)
        return MixPoint(workloads=workloads, prompt_tokens=general.prompt_tokens, output_tokens=general.output_tokens)
    return MixPoint(
        workloads=workloads,
        prompt_tokens=_two_figures(prompt),
        output_tokens=_two_figures(max(prompt / est.prefill_per_token, 1.0)),
    )


def table_for(est: Estimate, profile: Profile) -> Schedule:
    """The table ``vllm-table`` tunes from ``profile`` for the observed mix (``fleet.fallback.tuned_table``)."""
    mix = observed_mix(est, profile)
    seqs = est.max_num_seqs or TABLE_MAX_NUM_SEQS
    key = (id(profile), mix.workloads, mix.prompt_tokens, mix.output_tokens, seqs)
    hit = _TABLES.get(key)
    if hit is not None and hit[0] is profile:
        return hit[1]
    if len(_TABLES) >= _TABLES_MAX:
        _TABLES.clear()
    table = tuned_table(profile, mix, seqs)
    _TABLES[key] = (profile, table)
    return table


def table_gear(est: Estimate, profile: Profile) -> int:
    """The tuned table's k at the expected batch (the batch the candidates are predicted at, rounded)."""
    table = table_for(est, profile)
    bs = min(expected_batch_size(max(est.batch, est.batch_ahead, 1.0)), table[-1][1])
    return next(k for lo, hi, k in table if lo <= bs <= hi)


def _predict(
    est: Estimate,
    profile: Profile,
    k: int,
    target: float | None,
    allowed: bool,
    min_share: float,
    *,
    drafter_loaded: bool,
    ttft_target: float | None = None,
    excluded_by: str = "",
) -> Candidate:
    batch = max(est.batch, est.batch_ahead, 1.0)  # a queue being admitted: decide for the batch it makes
    al = expected_tokens_per_step(est.conditional, k)
    prefill = est.prefill_per_token * batch * al  # the prompts that follow the tokens this step emits
    raw = predict_step(
        profile,
        batch=batch,
        k=k,
        context_per_seq=est.context_per_seq,
        prefill_per_step=prefill,
        drafter_loaded=drafter_loaded,
    )
    c = est.correction_for(k)
    step = raw.total_s * c
    tpot = step / al
    slowest = tpot / slowest_al_ratio(profile, est.class_mix, k, est.context_per_seq, min_share=min_share)
    goodput = batch * al / step
    ttft = predict_prefill_s(est, profile, k, drafter_loaded=drafter_loaded, goodput_tok_s=goodput)
    return Candidate(
        k=k,
        step_s=step,
        target_s=raw.target_s * c,
        drafter_s=raw.drafter_s * c,
        accepted_length=al,
        goodput_tok_s=goodput,
        tpot_s=tpot,
        feasible=target is None or slowest <= target,
        allowed=allowed,
        tpot_slowest_s=slowest if slowest != tpot else None,
        ttft_s=ttft,
        ttft_ok=ttft_target is None or ttft is None or ttft <= ttft_target,
        excluded_by=excluded_by,
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


def decide(
    est: Estimate,
    profile: Profile,
    *,
    tpot_target_s: float | None,
    config: PolicyConfig,
    full_speed: FullSpeed | None = None,
    drafter_loaded: bool = True,
    ttft_target_s: float | None = None,
) -> Decision:
    """Choose the k for one worker (pure: same inputs, same decision). ``full_speed``: what the worker advertises
    (None: every k); ``drafter_loaded``: the worker was started with its drafter (every worker it shifts is);
    ``ttft_target_s``: the tightest TTFT target of its tiers, seconds (None: none)."""
    gears = advertised_gears(est.k_max, full_speed, config.k_tiers)
    # k = 0, the safe fallback, is always a candidate unless the operator's k_tiers leave it out on purpose.
    fallback = {0} if config.k_tiers is None or 0 in config.k_tiers else set()
    ks = sorted({*fallback, *gears, min(est.k_current, est.k_max)})
    risk, risk_text = _risk(est, config)
    margin = 1.0 - config.tpot_margin

    def target_for(k: int) -> float | None:
        return tpot_target_s * margin if tpot_target_s is not None and k > est.k_current else tpot_target_s

    def ttft_for(k: int) -> float | None:
        return ttft_target_s * margin if ttft_target_s is not None and k > est.k_current else ttft_target_s

    share = config.class_min_share
    cands = tuple(
        _predict(
            est, profile, k, target_for(k), _allowed(k, est, risk), share,
            drafter_loaded=drafter_loaded, ttft_target=ttft_for(k),
            excluded_by=excluded_reason(k, full_speed, est.batch),
        )
        for k in ks
    )  # fmt: skip
    allowed = [c for c in cands if c.allowed and c.full_speed] or [c for c in cands if c.allowed]
    snap_to = sorted(c.k for c in allowed)  # the table's gear snaps to these, not to the TTFT-filtered set below
    feasible = [c for c in allowed if c.feasible]
    overloaded = not feasible
    ttft_text = ""
    if feasible and ttft_target_s is not None:
        prompt_ok = [c for c in feasible if c.ttft_ok]
        if prompt_ok and len(prompt_ok) < len(feasible):
            dropped = ", ".join(str(c.k) for c in feasible if not c.ttft_ok)
            ttft_text = f"TTFT target {ttft_target_s:.1f} s rules out k={dropped}"
            allowed = [c for c in allowed if c.ttft_ok]
            feasible = prompt_ok
        elif not prompt_ok:
            ttft_text = f"no k meets the TTFT target {ttft_target_s:.1f} s: set aside"
    table_k = None
    if config.start_from_table and snap_to:
        table_k = snap_gear(table_gear(est, profile), snap_to)
    basis, evidence = Basis.MODEL, ""
    fastest = min(c.tpot_worst_s for c in allowed)
    near = [c for c in allowed if c.tpot_worst_s <= fastest * (1 + config.overload_tpot_tolerance)]
    if feasible:
        pool = list({c.k: c for c in feasible + near}.values())
    else:  # no k meets it: with a queue, drain it (the most goodput); else the lowest TPOT (within the tolerance)
        pool = allowed if est.waiting >= config.overload_queue else near
    best = max(pool, key=lambda c: (c.goodput_tok_s, -c.k))
    if table_k is not None and not est.adaptive and risk is Risk.NONE:
        best, basis, evidence = _from_table(est, table_k, pool, best)
    current = next(c for c in cands if c.k == min(est.k_current, est.k_max))
    gain = best.goodput_tok_s / current.goodput_tok_s - 1 if current.goodput_tok_s > 0 else 0.0
    if risk is Risk.NONE and not current.feasible and best.feasible:
        risk, risk_text = Risk.SLA, f"TPOT at k={current.k} {current.tpot_worst_s * 1e3:.1f} ms misses the target"
    elif risk is Risk.NONE and current.feasible and not current.ttft_ok and best.ttft_ok and current.ttft_s:
        risk, risk_text = Risk.SLA, f"prefill at k={current.k} {current.ttft_s:.2f} s misses the TTFT target"
    risk_text = "; ".join(t for t in (risk_text, ttft_text) if t)
    return Decision(
        worker_id=est.worker_id,
        k=best.k,
        candidates=cands,
        overloaded=overloaded,
        risk=risk,
        gain=gain,
        reason=_reason(est, best, current, gain, overloaded, risk_text, tpot_target_s, evidence)
        + _excluded_text(cands),
        off=_predict(est, profile, 0, tpot_target_s, False, share, drafter_loaded=False),
        table_k=table_k,
        basis=basis,
        tpot_target_s=tpot_target_s,
    )


def snap_gear(k: int, gears: list[int]) -> int:
    """The gear of ``gears`` nearest ``k`` (the lower on a tie)."""
    return min(gears, key=lambda g: (abs(g - k), g))


def _from_table(
    est: Estimate, table_k: int, pool: list[Candidate], model_best: Candidate
) -> tuple[Candidate, Basis, str]:
    """The choice among ``pool`` (the k that meet the targets) that starts from the table's gear and leaves it only
    for a gear measured here with more goodput (module docstring), with the evidence in words."""
    gear = table_k
    by_k = {c.k: c for c in pool}
    at = f"the tuned table's gear at B≈{expected_batch_size(max(est.batch, est.batch_ahead, 1.0))}"
    table = by_k.get(gear)
    if table is None:
        return model_best, Basis.MODEL, f"{at} k={gear} is not among the k the targets allow: the model's choice"
    measured = [c for c in pool if est.observed_gear(c.k)]
    seen = ", ".join(str(c.k) for c in sorted(measured, key=lambda c: c.k)) or "none"
    if not est.observed_gear(gear):
        return table, Basis.TABLE, f"{at} (k={gear}, not yet measured at this batch; measured here: k={seen})"
    top = max(measured, key=lambda c: (c.goodput_tok_s, -c.k))
    if top.k == gear:
        return table, Basis.TABLE_MEASURED, f"{at}, measured here and not beaten (measured: k={seen})"
    lead = top.goodput_tok_s / table.goodput_tok_s - 1 if table.goodput_tok_s > 0 else 0.0
    why = (
        f"measured at this batch: k={top.k} {top.goodput_tok_s:.0f} tok/s vs {at} k={gear} "
        f"{table.goodput_tok_s:.0f} tok/s ({lead:+.1%}; measured: k={seen})"
    )
    return top, Basis.MEASURED, why


def _excluded_text(cands: tuple[Candidate, ...]) -> str:
    excluded = [str(c.k) for c in cands if not c.full_speed]
    return f"; not at full speed at this batch: k={', '.join(excluded)}" if excluded else ""


def _reason(
    est: Estimate,
    best: Candidate,
    current: Candidate,
    gain: float,
    overloaded: bool,
    risk_text: str,
    target: float | None,
    evidence: str = "",
) -> str:
    parts = [f"k={best.k}: goodput {best.goodput_tok_s:.0f} tok/s ({gain:+.0%} vs k={current.k})"]
    if evidence:
        parts.append(evidence)
    target_text = f"target {target * 1e3:.0f} ms" if target is not None else "no TPOT target"
    verdict = "no k meets the target: max per-user speed, overloaded" if overloaded else target_text
    slowest = f", slowest class {best.tpot_slowest_s * 1e3:.1f} ms" if best.tpot_slowest_s is not None else ""
    parts.append(f"TPOT {best.tpot_s * 1e3:.1f} ms{slowest} ({verdict})")
    if len(est.class_mix) > 1:
        parts.append("mix " + ", ".join(f"{c} {share:.0%}" for c, share in est.class_mix))
    parts.append(f"B={est.batch:.1f}, AL={best.accepted_length:.2f}")
    if est.drafts_seen <= 0:
        parts.append("no drafts seen yet: acceptance from the profile prior")
    elif est.observed_positions < best.k:
        parts.append(f"positions ≥ {est.observed_positions} from the shifted prior")
    if risk_text:
        parts.append(risk_text)
    return "; ".join(parts)
