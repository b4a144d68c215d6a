"""A shutdown drain (issue 27): before a worker's pod stops (a rollout, an eviction), its preStop hook marks it
draining in the store's worker modes (``fleet.worker_mode``), which every gateway reads, so no new request is
sent to it, then waits for the requests it has to finish. The worker that starts next clears the mark.

A shutdown drain is a ``draining`` record without a ``target``: it is no move between modes, so the controller
restarts nothing for it (``controller.gear_mode`` only lets it lapse after its drain timeout, should the worker
never come back to clear it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fleet.clock import Clock
from fleet.store.protocol import Store
from fleet.worker_mode import Mode, Phase, WorkerMode, read_modes, write_mode

SHUTDOWN_REASON = "shutdown drain (pod terminating)"

InFlight = Callable[[], Awaitable[int | None]]
"""Requests the worker is running or queueing now; None when it cannot be read (the worker is not answering)."""


@dataclass(frozen=True)
class DrainOutcome:
    drained: bool
    """True when the worker reported nothing in flight before the timeout."""
    waited_s: float
    in_flight: int | None
    """What the last reading showed (None: unreadable)."""


def is_shutdown_drain(mode: WorkerMode) -> bool:
    return mode.phase is Phase.DRAINING and mode.target is None


async def begin_shutdown_drain(store: Store, worker_id: str, *, clock: Clock) -> WorkerMode:
    """Mark ``worker_id`` draining (keeping the mode it runs in) and return the record written."""
    now = clock.wall()
    current = (await read_modes(store)).get(worker_id)
    mode = current.mode if current is not None else Mode.DRAFTER
    mode_since = current.mode_since if current is not None else now
    record = WorkerMode(
        worker_id=worker_id, mode=mode, phase=Phase.DRAINING, target=None, since=now, mode_since=mode_since,
        reason=SHUTDOWN_REASON,
    )  # fmt: skip
    await write_mode(store, record)
    return record


async def end_shutdown_drain(store: Store, worker_id: str, *, clock: Clock) -> bool:
    """Put ``worker_id`` back to ``serving`` if a shutdown drain left it draining; a move's record is left alone.
    True when it cleared one."""
    current = (await read_modes(store)).get(worker_id)
    if current is None or not is_shutdown_drain(current):
        return False
    update = {"phase": Phase.SERVING, "since": clock.wall(), "reason": "started again after a shutdown drain"}
    await write_mode(store, current.model_copy(update=update))
    return True


async def wait_drained(
    in_flight: InFlight, *, clock: Clock, timeout_s: float, poll_s: float = 1.0, settle_s: float = 2.0
) -> DrainOutcome:
    """Wait ``settle_s`` (every gateway re-reads the worker modes, ``GatewaySettings.state_refresh_s``, and requests
    already on their way arrive), then until ``in_flight`` reads 0 or ``timeout_s`` has passed since the start.
    An unreadable worker counts as drained: nothing can be served by it any more."""
    started = clock.monotonic()
    await clock.sleep(min(settle_s, timeout_s))
    while True:
        left = await in_flight()
        waited = clock.monotonic() - started
        if left is None or left == 0:
            return DrainOutcome(drained=True, waited_s=waited, in_flight=left)
        if waited + poll_s > timeout_s:
            return DrainOutcome(drained=False, waited_s=waited, in_flight=left)
        await clock.sleep(poll_s)
