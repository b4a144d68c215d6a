"""The stabiliser: limits how the applied k changes (STYLE 8; after Kubernetes' HPA).

A pure step function ``stabilise(state, decision, estimate, now) -> (state, action)``:

1. **Stale metrics**: hold for ``stale_hold_s``, then fall to the conservative default k.
2. **No data yet**: hold.
3. **Probe** in progress: hold at k_max for ``probe_s``, then take the policy's (now informed) k; a risk aborts it.
   A neighbour probe (5b) ends on the better of the two gears it compared (the policy's k when it is one of
   them, else the one with more goodput, both now measured): a different k the policy wants then goes through the
   normal path's hysteresis.
4. **Fast down**: when the policy flags a risk (KV, preemptions, acceptance collapse, a missed TPOT target) and
   wants a lower k, switch at once, ignoring dwell. A collapse schedules a re-probe after ``collapse_reprobe_s``.
5. **Probe due**: every ``probe_interval_s`` below k_max, if the policy predicts k_max costs at most
   ``probe_max_loss`` of goodput and meets the TPOT target — positions above the current k are unobservable
   otherwise. Only for a decision that rests on the model (``Basis.MODEL``): one that starts from the tuned
   table tunes it for the mix the observed positions show and explores by neighbour probes (5b), whose cost
   is bounded; a jump to k_max at a batch where it loses was the largest cost of exploring (6 s at −13 % at
   batch 16 on the MI355X random sweep). The re-probe after a collapse stays.
5b. **Neighbour probe** (issue 25): holding a gear whose neighbour (the next advertised gear up or down) has no
   step time measured at this batch band, run the neighbour for ``probe_s``, whatever the model predicts for it
   — a model that believes every k > 0 loses at a large batch would otherwise never be corrected there. The cost
   is bounded, not the prediction: probes of a neighbour predicted to lose ``L`` of goodput are spaced at least
   ``L · probe_s / probe_budget`` apart (and ``neighbour_probe_s``), so they spend at most ``probe_budget`` of
   the predicted goodput; the reason names the prediction and the cost. A neighbour predicted to miss the TPOT
   target is probed too when the TPOT averaged over the probe's interval (``probe_s`` there, the rest at the
   current gear) still meets it (``Decision.tpot_target_s``): the miss is the model's prediction, which the probe
   checks, and it lasts a few seconds of each request's life. Not on an adaptive worker (its engine
   explores under the cap itself). Holding a measured gear other than the tuned table's (``Basis.MEASURED``),
   the table's gear is probed the same way when its measurement is no longer fresh, so the evidence for leaving
   it is renewed at a bounded cost rather than remembered.
6. **Normal**: a recommendation counts only if its predicted gain exceeds ``gain_threshold``, or if it is the
   tuned table's gear not yet measured at this batch (``Basis.TABLE``: the default needs no predicted gain,
   since the prediction that it loses is what is unmeasured); go up when the
   last ``up_ticks`` recommendations were all higher (to the lowest of them), down when the last ``down_ticks``
   were all lower (to the highest of them). The dwell guards reversals: a move against the last normal move
   waits ``min_dwell_s`` at the current k, a move that continues it only ``continue_dwell_s``. Following a
   load step takes several moves when the recommendations still straddle the old and new load (64 → 512
   streams: k 3 → 2 → 0); each paid the full dwell before, which alone cost ~10 s at a losing k per step. A
   reversal is what flapping is, so that is what the dwell bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator

from controller.estimator import Estimate
from controller.policy import Basis, Candidate, Decision, Risk


class StabiliserConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gain_threshold: float = Field(0.05, ge=0)
    up_ticks: int = Field(3, ge=1)
    down_ticks: int = Field(2, ge=1)
    min_dwell_s: float = Field(10.0, ge=0)
    """Seconds at a k before a normal move that reverses the last one (down after up, up after down)."""
    continue_dwell_s: float = Field(4.0, ge=0)
    """Seconds at a k before a normal move in the same direction as the last one (``min_dwell_s`` when that is
    shorter)."""
    probe_interval_s: float = Field(120.0, gt=0)
    """Seconds between periodic probes; every probe is two switches, so this bounds their share of the switch
    rate (1 per worker-minute at 120 s)."""
    probe_s: float = Field(4.0, gt=0)
    """How long a probe holds k_max: at least two ticks (the window that contains the switch is discarded)."""
    probe_max_loss: float = Field(0.25, ge=0, le=1)
    collapse_reprobe_s: float = Field(60.0, gt=0)
    neighbour_probe_s: float = Field(30.0, gt=0)
    """Least seconds between two neighbour probes of one worker."""
    probe_budget: float = Field(0.05, gt=0, le=1)
    """Share of the predicted goodput neighbour probes may spend (predicted loss × probe time / interval). The
    loss is the model's prediction, so a model that is wrong in the probe's favour spends less: at 2 %, a wrong
    model writing off every k > 0 at 512 streams (the robustness grid's MI355X-believed TP16 cell) probed k = 1
    once in 96 s and lost 10 %; at 5 %, 3.8 %. On the policies suite's cells the ``neighbour_probe_s`` floor
    binds instead, and 2 % and 5 % give the same goodput."""
    stale_hold_s: float = Field(10.0, ge=0)
    conservative_k: int = Field(1, ge=0)
    """The k a worker whose metrics stay stale is set to: small enough to cost little at any load."""

    @model_validator(mode="after")
    def _check(self) -> StabiliserConfig:
        if self.probe_interval_s <= self.probe_s:
            raise ValueError("probe_interval_s: must exceed probe_s")
        return self


class ActionKind(StrEnum):
    HOLD = "hold"
    UP = "up"
    DOWN = "down"
    FAST_DOWN = "fast-down"
    PROBE = "probe"
    PROBE_END = "probe-end"
    STALE_DEFAULT = "stale-default"
    PLAN = "plan"
    """The fleet plan's pool gear (``controller.placement.obey_pool``)."""


@dataclass(frozen=True, slots=True)
class StabiliserState:
    k: int
    since_s: float
    history: tuple[int, ...] = ()
    probe_until_s: float | None = None
    last_probe_s: float = 0.0
    reprobe_at_s: float | None = None
    last_neighbour_probe_s: float = 0.0
    direction: int = 0
    neighbour_probing: bool = False
    """The probe in progress is a neighbour probe (``_neighbour_probe``)."""
    probe_from: int = 0
    """The gear a neighbour probe left (where it returns unless the probed gear measured better)."""
    climbing: bool = False
    """The last neighbour probe found its gear better and stayed there: the next neighbour probe waits only
    ``min_dwell_s``, not ``neighbour_probe_s`` (a wrong model is climbed out of one gear per dwell, not per 30 s;
    the budget spacing by predicted loss still holds)."""
    """The last move's direction: +1 a normal move up, -1 down (a fast down counts), 0 none since the last
    probe, stale default or plan, after which the next normal move waits the full dwell."""


@dataclass(frozen=True, slots=True)
class Action:
    k: int
    kind: ActionKind
    reason: str

    @property
    def changed(self) -> bool:
        return self.kind is not ActionKind.HOLD


_DIRECTED = frozenset({ActionKind.UP, ActionKind.DOWN, ActionKind.FAST_DOWN})
"""The moves whose direction the dwell remembers (``StabiliserState.direction``)."""


def initial_state(k: int, now: float) -> StabiliserState:
    """State for a worker first seen at ``now`` running ``k`` (its first probe is one interval away)."""
    return StabiliserState(k=k, since_s=now, last_probe_s=now, last_neighbour_probe_s=now)


def _switch(
    state: StabiliserState, k: int, now: float, kind: ActionKind, reason: str
) -> tuple[StabiliserState, Action]:
    if k == state.k:
        held = replace(state, history=(), probe_until_s=None, neighbour_probing=False)
        return held, Action(k, ActionKind.HOLD, reason)
    direction = (1 if k > state.k else -1) if kind in _DIRECTED else 0
    new = replace(
        state, k=k, since_s=now, history=(), probe_until_s=None, direction=direction, neighbour_probing=False,
        climbing=False,
    )  # fmt: skip
    return new, Action(k, kind, reason)


def _hold(state: StabiliserState, reason: str) -> tuple[StabiliserState, Action]:
    return state, Action(state.k, ActionKind.HOLD, reason)


def stabilise(
    state: StabiliserState, decision: Decision, est: Estimate, now: float, cfg: StabiliserConfig
) -> tuple[StabiliserState, Action]:
    """One tick of the stabiliser for one worker (pure)."""
    if est.stale:
        if est.stale_for_s < cfg.stale_hold_s:
            return _hold(state, f"metrics stale for {est.stale_for_s:.0f} s: holding")
        k = min(cfg.conservative_k, est.k_max)
        return _switch(state, k, now, ActionKind.STALE_DEFAULT, f"metrics stale for {est.stale_for_s:.0f} s: k={k}")
    if est.windows == 0:
        return _hold(state, "no complete metrics window yet: holding")
    if state.probe_until_s is not None:
        if decision.risk in (Risk.KV, Risk.PREEMPTION, Risk.COLLAPSE):
            return _switch(state, decision.k, now, ActionKind.FAST_DOWN, f"probe aborted: {decision.reason}")
        if now < state.probe_until_s:
            return _hold(state, f"probing k={state.k} until acceptance beyond the old k is measured")
        k = decision.k
        if state.neighbour_probing and k not in (state.k, state.probe_from):
            k = _better(decision, state.k, state.probe_from)  # any other move takes the normal path from there
        new, action = _switch(state, k, now, ActionKind.PROBE_END, f"probe done: {decision.reason}")
        if state.neighbour_probing and k == state.k:  # the neighbour measured better: keep climbing
            new = replace(new, climbing=True)
        return new, action
    if decision.risk is not Risk.NONE and decision.k < state.k:
        new, action = _switch(state, decision.k, now, ActionKind.FAST_DOWN, decision.reason)
        if decision.risk is Risk.COLLAPSE:
            new = replace(new, reprobe_at_s=now + cfg.collapse_reprobe_s)
        return new, action
    probe = _probe(state, decision, est, now, cfg) or _neighbour_probe(state, decision, est, now, cfg)
    if probe is not None:
        return probe
    return _normal(state, decision, now, cfg)


def _better(decision: Decision, probed: int, left: int) -> int:
    """The gear of the two a neighbour probe compared with more goodput in ``decision`` (``left`` on a tie, or
    when either is not a candidate)."""
    a, b = decision.candidate(probed), decision.candidate(left)
    return probed if a is not None and b is not None and a.goodput_tok_s > b.goodput_tok_s else left


def _probe(
    state: StabiliserState, decision: Decision, est: Estimate, now: float, cfg: StabiliserConfig
) -> tuple[StabiliserState, Action] | None:
    if state.k >= est.k_max or decision.risk is not Risk.NONE:
        return None
    if state.reprobe_at_s is not None:
        if now < state.reprobe_at_s:
            return None
        why = "re-probing after an acceptance collapse"
    else:
        if now - state.last_probe_s < cfg.probe_interval_s or decision.basis is not Basis.MODEL:
            return None  # a decision on the table's gear explores by neighbour probes, at a bounded cost
        top, cur = decision.candidate(est.k_max), decision.candidate(state.k)
        if top is None or cur is None or top.goodput_tok_s < (1 - cfg.probe_max_loss) * cur.goodput_tok_s:
            return None
        if not top.feasible or not top.full_speed:
            return None  # a probe would break (or deepen a miss of) the TPOT target, or run k_max eager
        why = "periodic probe: positions above the current k are unobservable"
    new = replace(
        state, k=est.k_max, since_s=now, history=(), probe_until_s=now + cfg.probe_s, last_probe_s=now,
        reprobe_at_s=None,
    )  # fmt: skip
    return new, Action(est.k_max, ActionKind.PROBE, why)


def _neighbour_probe(
    state: StabiliserState, decision: Decision, est: Estimate, now: float, cfg: StabiliserConfig
) -> tuple[StabiliserState, Action] | None:
    if decision.risk is not Risk.NONE or decision.k != state.k or now - state.since_s < cfg.min_dwell_s:
        return None
    if est.adaptive:
        return None  # the engine already tries every verification length under the cap, step by step
    cur = decision.candidate(state.k)
    if cur is None or cur.goodput_tok_s <= 0:
        return None
    gears = sorted(c.k for c in decision.candidates if c.allowed and c.full_speed)
    if state.k not in gears:
        return None
    at = gears.index(state.k)
    sides = [gears[i] for i in (at - 1, at + 1) if 0 <= i < len(gears)]
    if decision.basis is Basis.MEASURED and decision.table_k in gears and decision.table_k != state.k:
        sides.append(decision.table_k)  # the evidence for leaving the table is renewed, not remembered
    floor = cfg.min_dwell_s if state.climbing else cfg.neighbour_probe_s

    def interval_for(c: Candidate) -> float:
        loss = max(0.0, 1.0 - c.goodput_tok_s / cur.goodput_tok_s)
        return max(floor, loss * cfg.probe_s / cfg.probe_budget)

    def keeps_target(c: Candidate) -> bool:
        """The TPOT over the probe's interval (``probe_s`` at ``c``, the rest at the current gear) meets the
        target: a probe is a few seconds of a request's life, so a neighbour the model predicts just past the
        target (a prediction, which the probe is there to check) is probed while the current gear has the slack."""
        target = decision.tpot_target_s
        if c.feasible or not cur.feasible or target is None:
            return True
        duty = min(cfg.probe_s / interval_for(c), 1.0)
        return (1 - duty) * cur.tpot_worst_s + duty * c.tpot_worst_s <= target

    unmeasured = [c for k in set(sides) if not est.observed_gear(k) and (c := decision.candidate(k)) is not None]
    unmeasured = [c for c in unmeasured if keeps_target(c)]
    if not unmeasured:
        return None
    pick = max(unmeasured, key=lambda c: (c.goodput_tok_s, c.k))
    loss = max(0.0, 1.0 - pick.goodput_tok_s / cur.goodput_tok_s)
    interval = interval_for(pick)
    if now - state.last_neighbour_probe_s < interval:
        return None
    why = (
        f"neighbour probe: k={pick.k} predicted {pick.goodput_tok_s:.0f} tok/s ({-loss:+.0%} vs k={state.k}) "
        f"at B={est.batch:.0f} but never measured at this batch; cost ≤ {loss * cfg.probe_s / interval:.1%} "
        f"of goodput ({cfg.probe_s:.0f} s every {interval:.0f} s)"
    )
    new = replace(
        state, k=pick.k, since_s=now, history=(), probe_until_s=now + cfg.probe_s, last_neighbour_probe_s=now,
        neighbour_probing=True, climbing=False, probe_from=state.k,
    )  # fmt: skip
    return new, Action(pick.k, ActionKind.PROBE, why)


def _normal(
    state: StabiliserState, decision: Decision, now: float, cfg: StabiliserConfig
) -> tuple[StabiliserState, Action]:
    to_table = decision.basis is Basis.TABLE
    wanted = decision.k if decision.gain >= cfg.gain_threshold or to_table else state.k
    history = (*state.history, wanted)[-max(cfg.up_ticks, cfg.down_ticks) :]
    state = replace(state, history=history)
    dwelt, short = now - state.since_s, min(cfg.continue_dwell_s, cfg.min_dwell_s)
    if dwelt < short:
        return _hold(state, f"dwell: {dwelt:.0f} s of {short:.0f} s at k={state.k}")
    ups = history[-cfg.up_ticks :]
    if len(ups) == cfg.up_ticks and all(k > state.k for k in ups):
        if state.direction <= 0 and dwelt < cfg.min_dwell_s:
            return _hold(state, f"dwell before reversing up: {dwelt:.0f} s of {cfg.min_dwell_s:.0f} s at k={state.k}")
        return _switch(state, min(ups), now, ActionKind.UP, decision.reason)
    downs = history[-cfg.down_ticks :]
    if len(downs) == cfg.down_ticks and all(k < state.k for k in downs):
        if state.direction >= 0 and dwelt < cfg.min_dwell_s:
            why = f"dwell before reversing down: {dwelt:.0f} s of {cfg.min_dwell_s:.0f} s at k={state.k}"
            return _hold(state, why)
        return _switch(state, max(downs), now, ActionKind.DOWN, decision.reason)
    if wanted != state.k:
        return _hold(state, f"k={wanted} preferred, waiting for it to persist: {decision.reason}")
    if decision.k != state.k:
        return _hold(state, f"gain {decision.gain:+.0%} of k={decision.k} below {cfg.gain_threshold:.0%}: holding")
    return _hold(state, decision.reason)
