"""The drafter-free gear: when to take a worker to a true "off" (restarted without its drafter) and back.

The pure rule (issue 14); ``controller.gear_mode`` carries its verdicts out (drain, restart, return). k = 0 on a
worker started with a drafter still pays the idle-drafter tax (``fleet.perf.IdleDrafterTax``); only a restart
without the drafter removes it, and the restart takes the worker's capacity away for ``restart_s``
(``fleet.perf.ServingSettings.restart_s``). So the decision is fleet-level. ``plan_restarts`` proposes, per model,
at most one worker at a time:

- **to drafter-free** when the controller has chosen k = 0 on it, or predicted that drafter-free k = 0 beats the
  gear it holds (``controller.gear_mode``), for longer than ``dwell_factor × restart_s`` (the restart is then at
  most a tenth of the stretch it pays off over);
- **back to the drafter** when, on a drafter-free worker, the policy has predicted for as long that a k > 0
  would pay (``spec_pays_since_s``);

and only when all of these hold: the operator allows it (``enabled``, the worker not in ``forbidden``), the worker
has been in its current mode for ``min_dwell_s``, no other worker of its model is draining or restarting, it is
not the last healthy worker of its model, and:

- **capacity through the restart** (issue 25, replacing the fixed 80 % headroom rule): the model's other healthy
  workers' capacity (× ``headroom``, 1 by default) is at least the model's forecast peak for the restart's
  duration (``forecast_peak_tok_s``: the forecast band's upper edge; the load now when there is no forecast);
- **worth it**: the move's predicted gain over the horizon, ``gain_tok_s × horizon_s`` (``horizon_s``, by default
  ``dwell_factor × restart_s``, the stretch the mode has already been wanted for), exceeds by ``move_margin`` its
  cost, the capacity lost while it restarts: ``restart_s ×`` its share of the forecast load (tokens, counted as
  lost even where the others absorb some: the SLA pays for what they absorb).

A fresh fleet plan (``controller.planner``, which searches drafter modes with the pools) overrides the two
stretches: a worker whose pool's mode differs from its own is asked to move at once
(``WorkerGear.planned_drafter``), one whose pool keeps its mode stays. A planned move still needs the operator's
switches, the dwell, one move at a time and another healthy worker; the last two checks are the planner's
(it weighed the gain against the cost and kept the SLAs through the restart).

Every worker gets a verdict with its reason, gain and cost included (for ``explain``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class DrafterFreeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    """The operator's fleet-wide switch (``GEARSHIFT_DRAFTER_FREE__ENABLED``; off by default)."""
    forbidden: frozenset[str] = frozenset()
    """Worker ids the operator keeps as they are started (``GEARSHIFT_DRAFTER_FREE__FORBIDDEN``; the fleet file's
    ``allow_drafter_free: false`` adds to it)."""
    dwell_factor: float = Field(10.0, ge=1)
    """A mode must have been wanted for this many restart times before a restart is proposed."""
    min_dwell_s: float = Field(1800.0, ge=0)
    """Least time a worker stays in a drafter mode after a restart, seconds; after a failed one too (it came back in
    its old mode, or was given up), so that the plan does not drain and restart it again at once
    (``controller.gear_mode``)."""
    headroom: float = Field(1.0, gt=0, le=1)
    """Share of the other workers' capacity the model's forecast peak may take while one restarts."""
    horizon_s: float | None = Field(None, gt=0)
    """Seconds a move's gain is counted over (None: ``dwell_factor`` × restart_s)."""
    move_margin: float = Field(0.1, ge=0)
    """A move's gain over the horizon must exceed its cost by this fraction."""
    drain_grace_s: float = Field(10.0, ge=0)
    """Least time a worker drains before its restart, seconds: every gateway replica must have re-read its mode
    (``GatewaySettings.state_refresh_s``) so that none still sends it requests."""
    drain_timeout_s: float = Field(600.0, gt=0)
    """A drain that has not emptied the worker by then is given up (it serves again in its old mode), seconds."""
    restart_timeout_factor: float = Field(3.0, gt=1)
    """A restart whose supervisor has not reported the new mode within this many of the worker's restart times is
    given up: the worker serves again in the mode it was last seen in, and the rule may move others (issue 23)."""


class Move(StrEnum):
    STAY = "stay"
    TO_DRAFTER_FREE = "to-drafter-free"
    TO_DRAFTER = "to-drafter"


@dataclass(frozen=True, slots=True)
class WorkerGear:
    """What the rule needs to know of one worker. Times are controller seconds; rates output tokens/s."""

    worker_id: str
    model: str
    healthy: bool
    drafter_loaded: bool
    mode_since_s: float
    """When the worker last started in its current mode (with or without the drafter)."""
    load_tok_s: float
    """Output tokens per second it serves now."""
    capacity_tok_s: float
    """Output tokens per second it could serve at its best gear within the TPOT target."""
    k0_since_s: float | None = None
    """Since when k = 0 has been wanted without a break: held by the controller, or predicted drafter-free to beat
    the gear it holds (``controller.gear_mode.GearObservation.off_pays``; None: not wanted)."""
    spec_pays_since_s: float | None = None
    """On a drafter-free worker, since when a k > 0 has been predicted to pay without a break (None: it has not)."""
    draining: bool = False
    """Draining or restarting now (its capacity is already gone)."""
    gain_tok_s: float = 0.0
    """Output tokens per second the move adds on this worker's load, as the policy predicts it (drafter-free k = 0
    over the gear it holds, or the best gear with the drafter over drafter-free k = 0)."""
    planned_drafter: bool | None = None
    """The drafter mode the fresh fleet plan gives this worker's pool (True: loaded; None: no plan). The plan has
    weighed the move's gain over its horizon against its cost and kept the SLA through it
    (``controller.planner``), so a planned move is wanted at once and needs no stretch nor gain of its own here."""


@dataclass(frozen=True, slots=True)
class Verdict:
    worker_id: str
    move: Move
    reason: str


def _wanted(w: WorkerGear, now_s: float, restart_s: float, cfg: DrafterFreeConfig) -> tuple[Move, str]:
    """The move the fleet plan, or else this worker's own history, asks for, or STAY with why not."""
    if w.planned_drafter is not None:
        mode = "with its drafter" if w.planned_drafter else "drafter-free"
        if w.planned_drafter == w.drafter_loaded:
            return Move.STAY, f"the fleet plan keeps it {mode}"
        return (Move.TO_DRAFTER if w.planned_drafter else Move.TO_DRAFTER_FREE), f"the fleet plan wants it {mode}"
    since, target = (w.k0_since_s, Move.TO_DRAFTER_FREE) if w.drafter_loaded else (w.spec_pays_since_s, Move.TO_DRAFTER)
    want = "k = 0" if w.drafter_loaded else "a k > 0"
    need = cfg.dwell_factor * restart_s
    if since is None:
        return Move.STAY, f"{want} not wanted"
    if now_s - since < need:
        return Move.STAY, f"{want} wanted for {now_s - since:.0f} s of {need:.0f} s ({cfg.dwell_factor:g} × restart_s)"
    return target, f"{want} wanted for {now_s - since:.0f} s ≥ {need:.0f} s"


def _blocked(
    w: WorkerGear,
    fleet: Sequence[WorkerGear],
    now_s: float,
    restart_s: float,
    peak_tok_s: float | None,
    cfg: DrafterFreeConfig,
) -> str:
    """Why this worker may not restart now ('' when it may)."""
    if not cfg.enabled:
        return "forbidden fleet-wide by the operator"
    if w.worker_id in cfg.forbidden:
        return "forbidden for this worker by the operator"
    if not w.healthy or w.draining:
        return "not a healthy serving worker"
    if now_s - w.mode_since_s < cfg.min_dwell_s:
        return f"in this mode for {now_s - w.mode_since_s:.0f} s of the minimum {cfg.min_dwell_s:.0f} s"
    peers = [p for p in fleet if p.model == w.model and p.worker_id != w.worker_id]
    if any(p.draining for p in peers):
        return "another worker of the model is draining or restarting"
    others = [p for p in peers if p.healthy]
    if not others:
        return "the last healthy worker of its model"
    if w.planned_drafter is not None:  # the planner checked its SLAs through the restart and its worth
        return ""
    load = sum(p.load_tok_s for p in fleet if p.model == w.model and p.healthy)
    peak = load if peak_tok_s is None else peak_tok_s
    room = cfg.headroom * sum(p.capacity_tok_s for p in others)
    if peak > room:
        what = "forecast peak" if peak_tok_s is not None else "load"
        return f"the others' {room:.0f} tok/s cannot carry the {what} {peak:.0f} tok/s through the restart"
    return _not_worth(w, load, peak, restart_s, cfg)


def move_worth(
    w: WorkerGear, load_tok_s: float, peak_tok_s: float, restart_s: float, cfg: DrafterFreeConfig
) -> tuple[float, float]:
    """(gain, cost) of moving ``w``, output tokens: its predicted gain over the horizon, and ``restart_s`` × its
    share of the model's forecast load (``peak_tok_s`` split as the load now is)."""
    horizon = cfg.horizon_s if cfg.horizon_s is not None else cfg.dwell_factor * restart_s
    share = w.load_tok_s / load_tok_s if load_tok_s > 0 else 0.0
    return max(w.gain_tok_s, 0.0) * horizon, restart_s * share * peak_tok_s


def _not_worth(w: WorkerGear, load: float, peak: float, restart_s: float, cfg: DrafterFreeConfig) -> str:
    gain, cost = move_worth(w, load, peak, restart_s, cfg)
    if gain < cost * (1 + cfg.move_margin):  # an idle worker (no gain, no cost) may move
        return f"gain {gain:.0f} tok over the horizon ≤ the restart's cost {cost:.0f} tok + {cfg.move_margin:.0%}"
    return ""


def plan_restarts(
    fleet: Sequence[WorkerGear],
    *,
    now_s: float,
    restart_s: float,
    config: DrafterFreeConfig,
    forecast_peak_tok_s: Mapping[str, float] | None = None,
) -> list[Verdict]:
    """A verdict for every worker; at most one restart per model (the longest-waiting asker first).
    ``forecast_peak_tok_s``: model → its forecast peak output rate over the restart, tokens/s (the band's upper
    edge; a model left out is planned on its load now)."""
    peaks = forecast_peak_tok_s or {}
    verdicts: dict[str, Verdict] = {}
    started: set[str] = set()
    asking = []
    for w in fleet:
        move, why = _wanted(w, now_s, restart_s, config)
        if move is Move.STAY:
            verdicts[w.worker_id] = Verdict(w.worker_id, Move.STAY, why)
        else:
            since = w.k0_since_s if w.drafter_loaded else w.spec_pays_since_s
            asking.append((since if since is not None else now_s, w, move, why))
    for _, w, move, why in sorted(asking, key=lambda a: (a[0], a[1].worker_id)):
        blocked = _blocked(w, fleet, now_s, restart_s, peaks.get(w.model), config)
        if not blocked and w.model in started:
            blocked = "another worker of the model restarts first"
        if blocked:
            verdicts[w.worker_id] = Verdict(w.worker_id, Move.STAY, f"{why}, but {blocked}")
        else:
            started.add(w.model)
            load = sum(p.load_tok_s for p in fleet if p.model == w.model and p.healthy)
            gain, cost = move_worth(w, load, peaks.get(w.model, load), restart_s, config)
            worth = "gain and cost weighed by the plan" if w.planned_drafter is not None else (
                f"gain {gain:.0f} tok > cost {cost:.0f} tok"
            )  # fmt: skip
            verdicts[w.worker_id] = Verdict(w.worker_id, move, f"{why}; {worth}")
    return [verdicts[w.worker_id] for w in fleet]
