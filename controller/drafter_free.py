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
not the last healthy worker of its model, and the model's other healthy workers can carry its whole load within
``headroom`` of their capacity. Every worker gets a verdict with its reason (for ``explain``).
"""

from __future__ import annotations

from collections.abc import Sequence
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
    """Least time a worker stays in a drafter mode after a restart, seconds."""
    headroom: float = Field(0.8, gt=0, le=1)
    """Share of the other workers' capacity the model's load may take while one restarts."""
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


@dataclass(frozen=True, slots=True)
class Verdict:
    worker_id: str
    move: Move
    reason: str


def _wanted(w: WorkerGear, now_s: float, restart_s: float, cfg: DrafterFreeConfig) -> tuple[Move, str]:
    """The move this worker's own history asks for, or STAY with why not."""
    since, target = (w.k0_since_s, Move.TO_DRAFTER_FREE) if w.drafter_loaded else (w.spec_pays_since_s, Move.TO_DRAFTER)
    want = "k = 0" if w.drafter_loaded else "a k > 0"
    need = cfg.dwell_factor * restart_s
    if since is None:
        return Move.STAY, f"{want} not wanted"
    if now_s - since < need:
        return Move.STAY, f"{want} wanted for {now_s - since:.0f} s of {need:.0f} s ({cfg.dwell_factor:g} × restart_s)"
    return target, f"{want} wanted for {now_s - since:.0f} s ≥ {need:.0f} s"


def _blocked(w: WorkerGear, fleet: Sequence[WorkerGear], now_s: float, cfg: DrafterFreeConfig) -> str:
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
    load = sum(p.load_tok_s for p in fleet if p.model == w.model and p.healthy)
    room = cfg.headroom * sum(p.capacity_tok_s for p in others)
    if load > room:
        return f"the others cannot carry {load:.0f} tok/s within {cfg.headroom:.0%} of their {room / cfg.headroom:.0f}"
    return ""


def plan_restarts(
    fleet: Sequence[WorkerGear], *, now_s: float, restart_s: float, config: DrafterFreeConfig
) -> list[Verdict]:
    """A verdict for every worker; at most one restart per model (the longest-waiting asker first)."""
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
        blocked = _blocked(w, fleet, now_s, config)
        if not blocked and w.model in started:
            blocked = "another worker of the model restarts first"
        if blocked:
            verdicts[w.worker_id] = Verdict(w.worker_id, Move.STAY, f"{why}, but {blocked}")
        else:
            started.add(w.model)
            verdicts[w.worker_id] = Verdict(w.worker_id, move, why)
    return [verdicts[w.worker_id] for w in fleet]
