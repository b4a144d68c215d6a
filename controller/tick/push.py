"""Stage 4, push: PUT the governed k (or, on a worker that restricts full speed, its gear's schedule) with a
lease, and renew the lease at half its length while nothing changes (DESIGN §3.1)."""

from __future__ import annotations

import logging

from controller.actuator import ActuationError, Actuator
from controller.full_speed import gear_schedule
from controller.metrics import ControllerMetrics
from controller.runtime import WorkerRuntime
from fleet.speculation import Schedule, ScheduleError, SpeculationUpdate, check_full_speed

log = logging.getLogger("gearshift.controller")


def desired_schedule(rt: WorkerRuntime, k: int) -> Schedule | None:
    """The schedule to PUT for ``k`` on a worker that restricts full speed (None: a plain k)."""
    if rt.full_speed is None:
        return None
    return gear_schedule(k, rt.full_speed, max_num_seqs=rt.seqs)


class Pusher:
    """Applies each worker's governed k through ``actuator`` with ``lease_s``-second leases."""

    def __init__(self, *, actuator: Actuator, lease_s: float, metrics: ControllerMetrics) -> None:
        self.actuator = actuator
        self.lease_s = lease_s
        self.metrics = metrics

    async def push(self, rt: WorkerRuntime, now: float) -> None:
        """Change or renew the worker's schedule when due. ``now``: the loop's monotonic time, seconds."""
        if rt.stab is None or rt.version is None:
            return
        schedule = desired_schedule(rt, rt.stab.k)
        change = rt.stab.k != rt.k_applied if schedule is None else schedule != rt.schedule_applied
        renew = rt.version > 0 and now >= rt.renew_at_s
        if not change and not renew:
            return
        update = self._update(rt, schedule, rt.version + 1 if change or rt.lapsed else rt.version)
        if update is None:
            return
        try:
            state = await self.actuator.apply(rt.config, update)
        except ActuationError as exc:
            self.metrics.actuation_failures.labels(rt.config.id).inc()
            log.warning("%s", exc)
            if exc.stale_version:
                rt.version = None  # learn the worker's version again next tick
            return
        rt.learn(state)
        rt.renew_at_s = now + self.lease_s / 2
        if change:
            rt.rebase = True  # the next window would straddle the switch
            rt.switches.append((now, rt.stab.k))  # the gear: a full-speed schedule may hold lower k at other sizes

    def _update(self, rt: WorkerRuntime, schedule: Schedule | None, version: int) -> SpeculationUpdate | None:
        assert rt.stab is not None
        reason = (rt.action.reason if rt.action is not None else "")[:500]
        if schedule is None:
            return SpeculationUpdate(k=rt.stab.k, version=version, lease_seconds=self.lease_s, reason=reason)
        try:
            check_full_speed(schedule, rt.full_speed or ())
        except ScheduleError as exc:  # gear_schedule keeps to the advertised set: a bug if it ever fires
            self.metrics.actuation_failures.labels(rt.config.id).inc()
            log.error("worker %s: not sent, outside its full-speed set: %s", rt.config.id, exc)
            return None
        rows = [list(row) for row in schedule]
        return SpeculationUpdate(schedule=rows, version=version, lease_seconds=self.lease_s, reason=reason)
