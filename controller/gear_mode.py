"""Carrying out the drafter-free gear (issue 14): the rule's verdicts (``controller.drafter_free.plan_restarts``)
become moves of real workers, one phase per tick, recorded in the store (``fleet.worker_mode``):

1. ``serving`` → ``draining`` when the rule says move: the gateway stops sending the worker new requests;
2. ``draining`` → ``restarting`` once it has drained for ``drain_grace_s`` and its scrape shows nothing running
   or waiting: the controller asks it to restart in the other mode (``fleet.restart``). A drain that has not
   emptied it within ``drain_timeout_s`` is given up (back to ``serving`` in its old mode);
3. ``restarting`` → ``returning`` when the worker reports itself back in the new mode: routable again;
4. ``returning`` → ``serving`` on its next fresh scrape (the controller has read it again).

Only the leader runs this (``Controller.tick`` is called as leader); a new leader continues from the records. A
worker whose restart control does not answer at first sight is never moved (it gets no record). The k = 0 and
"speculation pays" stretches the rule needs are tracked here, per worker, from each tick's decision.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import httpx

from controller.drafter_free import DrafterFreeConfig, Move, Verdict, WorkerGear, plan_restarts
from controller.metrics import ControllerMetrics
from fleet.clock import Clock
from fleet.config import WorkerConfig
from fleet.restart import RestartCallError, RestartClient, RestartRequest, RestartState
from fleet.store.protocol import Store
from fleet.worker_mode import Mode, Phase, WorkerMode, read_modes, write_mode

log = logging.getLogger("gearshift.controller.gears")

NOT_BACK = "restart not back"
"""How the reason of a record given up after its restart begins: the worker serves in the mode it was last seen in,
which its restart control will confirm or correct once it answers (``GearModes._verify``)."""


class RestartError(RuntimeError):
    """A restart call failed (no answer, or a refusal)."""


class Restarter(Protocol):
    """Restarts workers with or without their drafter (``fleet.restart`` over HTTP, or in-process in the lab)."""

    async def state(self, worker: WorkerConfig) -> RestartState: ...

    async def restart(self, worker: WorkerConfig, *, drafter: bool, reason: str) -> RestartState: ...


class HttpRestarter:
    """``fleet.restart`` on each worker's ``restart_base_url``."""

    def __init__(self, client: httpx.AsyncClient, *, control_token: str) -> None:
        self._client = RestartClient(client, control_token=control_token)

    async def state(self, worker: WorkerConfig) -> RestartState:
        try:
            return await self._client.state(worker.restart_base_url)
        except RestartCallError as exc:
            raise RestartError(str(exc)) from exc

    async def restart(self, worker: WorkerConfig, *, drafter: bool, reason: str) -> RestartState:
        try:
            return await self._client.restart(worker.restart_base_url, RestartRequest(drafter=drafter, reason=reason))
        except RestartCallError as exc:
            raise RestartError(str(exc)) from exc


@dataclass(frozen=True, slots=True)
class GearObservation:
    """One worker as this tick saw it. Rates are output tokens per second."""

    worker_id: str
    fresh: bool
    """Its metrics were read this tick."""
    in_flight: float | None
    """Requests running or waiting on it (None: not read this tick)."""
    off_pays: bool
    """On a worker with its drafter: the controller holds k = 0, or the policy predicts that the same load on the
    worker started without its drafter (``Decision.off``: k = 0, no idle-drafter tax) beats the k it holds. With
    the tax counted, a drafter-loaded worker rarely holds k = 0 where drafter-free k = 0 would win."""
    spec_pays: bool
    """On a drafter-free worker: the policy's best k with the drafter would be above 0."""
    load_tok_s: float
    capacity_tok_s: float
    gain_tok_s: float = 0.0
    """Output tokens/s a move to the other drafter mode adds on this load, as predicted (``WorkerGear.gain_tok_s``)."""


@dataclass
class _Stretch:
    k0_since: float | None = None
    spec_pays_since: float | None = None


class GearModes:
    """The drafter-free moves of every worker of a fleet (see the module docstring). Times are Unix seconds."""

    def __init__(
        self,
        *,
        workers: Sequence[WorkerConfig],
        restart_s: Mapping[str, float],
        config: DrafterFreeConfig,
        restarter: Restarter,
        store: Store,
        clock: Clock,
    ) -> None:
        """``restart_s``: worker id → its profile's restart time, seconds (a worker missing from it is not moved)."""
        self.workers = {w.id: w for w in workers}
        self.restart_s = dict(restart_s)
        vetoed = {w.id for w in workers if not w.allow_drafter_free}
        self.config = config.model_copy(update={"forbidden": config.forbidden | vetoed})
        self.restarter = restarter
        self.store = store
        self.clock = clock
        self.modes: dict[str, WorkerMode] = {}
        self.verdicts: dict[str, Verdict] = {}
        self._stretch = {w.id: _Stretch() for w in workers}
        self._unrestartable: set[str] = set()
        self._exported: dict[str, tuple[str, str]] = {}
        self._planned: dict[str, bool] = {}

    def drafter_loaded(self, worker_id: str) -> bool:
        mode = self.modes.get(worker_id)
        return mode is None or mode.drafter_loaded

    def phase(self, worker_id: str) -> Phase:
        mode = self.modes.get(worker_id)
        return mode.phase if mode is not None else Phase.SERVING

    def may_move(self, worker_id: str) -> bool:
        """Whether the drafter-free gear may restart this worker (the operator's switches, a restart time, a
        restart control that answered): what the fleet plan may count on."""
        return (
            self.config.enabled
            and worker_id not in self.config.forbidden
            and worker_id in self.restart_s
            and worker_id in self.modes
            and worker_id not in self._unrestartable
        )

    async def tick(self, observations: Sequence[GearObservation], planned: Mapping[str, bool] | None = None) -> None:
        """One step of every worker's move; the rule is asked about the serving ones. ``planned``: worker → the
        drafter mode (True: loaded) its pool has in the fresh fleet plan (``WorkerGear.planned_drafter``)."""
        self._planned = dict(planned or {})
        now = self.clock.wall()
        self.modes.update(await read_modes(self.store))
        seen = {o.worker_id: o for o in observations if o.worker_id in self.workers}
        for wid, obs in seen.items():
            if wid not in self.modes and wid not in self._unrestartable and obs.fresh:
                await self._first_sight(wid, now)
            self._track(wid, obs, now)
        for wid, obs in seen.items():
            mode = self.modes.get(wid)
            if mode is not None and mode.phase is not Phase.SERVING:
                await self._advance(mode, obs, now)
            elif mode is not None and mode.reason.startswith(NOT_BACK):
                await self._verify(mode, now)
        await self._plan(seen, now)

    def export(self, metrics: ControllerMetrics) -> None:
        """Each worker's record as ``gearshift_controller_worker_mode{worker, mode, phase} 1``."""
        for wid, mode in self.modes.items():
            labels = (mode.mode.value, mode.phase.value)
            old = self._exported.get(wid)
            if old == labels:
                continue
            if old is not None:
                metrics.worker_mode.remove(wid, *old)
            metrics.worker_mode.labels(wid, *labels).set(1)
            self._exported[wid] = labels

    # ------------------------------------------------------------------------------------------ bookkeeping
    async def _first_sight(self, wid: str, now: float) -> None:
        try:
            state = await self.restarter.state(self.workers[wid])
        except RestartError as exc:
            self._unrestartable.add(wid)
            log.info("worker %s: no restart control (%s): it stays in the mode it was started in", wid, exc)
            return
        mode = Mode.DRAFTER if state.drafter else Mode.DRAFTER_FREE
        await self._write(WorkerMode(worker_id=wid, mode=mode, since=now, mode_since=now, reason="first seen"))

    def _track(self, wid: str, obs: GearObservation, now: float) -> None:
        s = self._stretch[wid]
        if not obs.fresh:
            return
        s.k0_since = (s.k0_since if s.k0_since is not None else now) if obs.off_pays else None
        s.spec_pays_since = (s.spec_pays_since if s.spec_pays_since is not None else now) if obs.spec_pays else None

    async def _write(self, mode: WorkerMode) -> None:
        await write_mode(self.store, mode)
        self.modes[mode.worker_id] = mode
        log.info("worker %s: %s %s: %s", mode.worker_id, mode.mode.value, mode.phase.value, mode.reason)

    # ---------------------------------------------------------------------------------------------- moves
    async def _plan(self, seen: Mapping[str, GearObservation], now: float) -> None:
        fleet = []
        for wid, obs in seen.items():
            mode = self.modes.get(wid)
            if mode is None:
                continue
            s, cfg = self._stretch[wid], self.workers[wid]
            fleet.append(
                WorkerGear(
                    worker_id=wid,
                    model=cfg.model,
                    healthy=obs.fresh,
                    drafter_loaded=mode.drafter_loaded,
                    mode_since_s=mode.mode_since,
                    load_tok_s=obs.load_tok_s,
                    capacity_tok_s=obs.capacity_tok_s,
                    gain_tok_s=obs.gain_tok_s,
                    k0_since_s=s.k0_since if mode.drafter_loaded else None,
                    spec_pays_since_s=None if mode.drafter_loaded else s.spec_pays_since,
                    draining=mode.phase is not Phase.SERVING,
                    planned_drafter=self._planned.get(wid),
                )
            )
        movable = [g.worker_id for g in fleet if g.worker_id in self.restart_s]
        if not movable:
            return
        restart_s = max(self.restart_s[wid] for wid in movable)
        # A worker with no restart time is never moved, but it still carries load for the others (the guard).
        config = self.config.model_copy(update={"forbidden": self.config.forbidden | (set(seen) - set(movable))})
        for verdict in plan_restarts(fleet, now_s=now, restart_s=restart_s, config=config):
            self.verdicts[verdict.worker_id] = verdict
            if verdict.move is Move.STAY:
                continue
            mode = self.modes[verdict.worker_id]
            target = Mode.DRAFTER_FREE if verdict.move is Move.TO_DRAFTER_FREE else Mode.DRAFTER
            await self._write(
                mode.model_copy(
                    update={"phase": Phase.DRAINING, "target": target, "since": now, "reason": verdict.reason}
                )
            )

    async def _advance(self, mode: WorkerMode, obs: GearObservation, now: float) -> None:
        if mode.phase is Phase.DRAINING:
            await self._after_drain(mode, obs, now)
        elif mode.phase is Phase.RESTARTING:
            await self._after_restart(mode, now)
        elif mode.phase is Phase.RETURNING and obs.fresh:
            await self._write(mode.model_copy(update={"phase": Phase.SERVING, "since": now, "reason": "serving"}))

    async def _after_drain(self, mode: WorkerMode, obs: GearObservation, now: float) -> None:
        drained_for = now - mode.since
        if drained_for > self.config.drain_timeout_s:
            reason = f"drain given up after {drained_for:.0f} s with {obs.in_flight} requests left"
            await self._serve_as_before(mode, now, reason)
            return
        if mode.target is None:  # a shutdown drain (fleet.drain): its pod goes away; the next start clears it
            return
        if drained_for < self.config.drain_grace_s or obs.in_flight != 0:
            return
        try:
            await self.restarter.restart(
                self.workers[mode.worker_id], drafter=mode.target is Mode.DRAFTER, reason=mode.reason
            )
        except RestartError as exc:
            await self._serve_as_before(mode, now, f"restart refused: {exc}")
            return
        await self._write(mode.model_copy(update={"phase": Phase.RESTARTING, "since": now}))

    async def _after_restart(self, mode: WorkerMode, now: float) -> None:
        """RESTARTING ends three ways: the supervisor reports the new mode (returning in it), reports the old one
        (its new mode did not start: returning as before), or has not reported either within
        ``restart_timeout_factor`` restart times (serving as before: the gateway's health checks judge it). After
        a failed restart the worker's minimum dwell counts from its end: a planned move needs no stretch, so
        without it the plan would drain and restart the same worker at once, in a loop, and the model's other
        moves (one at a time) would never run."""
        took = now - mode.since
        timeout_s = self.config.restart_timeout_factor * self.restart_s.get(mode.worker_id, 0.0)
        try:
            state = await self.restarter.state(self.workers[mode.worker_id])
        except RestartError as exc:  # down: a supervisor may be between processes, or gone
            if took > timeout_s:
                await self._serve_as_before(mode, now, f"{NOT_BACK} after {took:.0f} s ({exc})", restarted=True)
            return
        if state.restarting:
            if took > timeout_s:
                reason = f"{NOT_BACK} after {took:.0f} s (still restarting)"
                await self._serve_as_before(mode, now, reason, restarted=True)
            return
        assert mode.target is not None
        if state.drafter != (mode.target is Mode.DRAFTER):
            old = Mode.DRAFTER if state.drafter else Mode.DRAFTER_FREE
            log.warning("worker %s: restart fell back to %s after %.0f s", mode.worker_id, old.value, took)
            s = self._stretch[mode.worker_id]
            s.k0_since = s.spec_pays_since = None  # the stretch starts again: no drain straight after a failed one
            reason = f"restart fell back to {old.value} after {took:.0f} s"
            update = {
                "mode": old, "phase": Phase.RETURNING, "target": None, "since": now, "mode_since": now,
                "reason": reason,
            }  # fmt: skip
            await self._write(mode.model_copy(update=update))
            return
        s = self._stretch[mode.worker_id]
        s.k0_since = s.spec_pays_since = None
        await self._write(
            WorkerMode(
                worker_id=mode.worker_id,
                mode=mode.target,
                phase=Phase.RETURNING,
                since=now,
                mode_since=now,
                reason=f"restarted {mode.target.value} in {took:.0f} s",
            )
        )

    async def _verify(self, mode: WorkerMode, now: float) -> None:
        """A worker given up after its restart: once its restart control answers again, its record takes the mode
        the control reports (the restart may have taken after all). Read from the record, so a new leader
        verifies too; until the control answers, the worker serves in the mode it was last seen in."""
        try:
            state = await self.restarter.state(self.workers[mode.worker_id])
        except RestartError:
            return
        if state.restarting:
            return
        reported = Mode.DRAFTER if state.drafter else Mode.DRAFTER_FREE
        reason = f"its restart control answers again and reports {reported.value}"
        update: dict[str, object] = {"mode": reported, "since": now, "reason": reason}
        if reported is not mode.mode:
            log.warning("worker %s: %s (the record said %s)", mode.worker_id, reason, mode.mode.value)
            update["mode_since"] = now
        await self._write(mode.model_copy(update=update))

    async def _serve_as_before(self, mode: WorkerMode, now: float, reason: str, *, restarted: bool = False) -> None:
        """Serving again in the mode it was last seen in. ``restarted``: a restart was asked for and has not been
        seen to end in the new mode, so the worker has (or may have) started again: its minimum dwell counts from
        now, as after a restart that came back in its old mode."""
        log.warning("worker %s: %s", mode.worker_id, reason)
        s = self._stretch[mode.worker_id]
        s.k0_since = s.spec_pays_since = None  # the stretch starts again: no drain straight after a failed one
        update: dict[str, object] = {"phase": Phase.SERVING, "target": None, "since": now, "reason": reason}
        if restarted:
            update["mode_since"] = now
        await self._write(mode.model_copy(update=update))
