"""The real-time driver: one asyncio task steps an ``EngineCore`` and sleeps for each step's duration.

Simulated time runs ``speedup`` times faster than the injected clock. Each step's emitted tokens are
delivered, at the end of the step's sleep, to the queue of the HTTP request that owns them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from fleet.clock import Clock
from workers.sim.engine import EngineCore, SimRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Delivery:
    """Tokens for one choice of a request: ``tokens`` new output tokens; ``finished`` on the last one."""

    choice: int
    tokens: int
    finished: bool
    failed: bool = False
    """The engine failed; the request was aborted (a bug in the simulator, reported as a server error)."""


class RealTimeDriver:
    """Runs one engine on a clock. ``submit`` queues engine requests whose tokens go to a delivery queue."""

    def __init__(self, engine: EngineCore, *, clock: Clock, speedup: float = 1.0) -> None:
        if speedup <= 0:
            raise ValueError(f"speedup: must be > 0, got {speedup}")
        self.engine = engine
        self._clock = clock
        self._speedup = speedup
        self._origin = clock.monotonic()
        self._sinks: dict[str, tuple[asyncio.Queue[Delivery], int]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.step_errors = 0

    def sim_now(self) -> float:
        """Simulated seconds since the driver was created."""
        return (self._clock.monotonic() - self._origin) * self._speedup

    def submit(self, req: SimRequest, sink: asyncio.Queue[Delivery], choice: int = 0) -> None:
        """Add ``req`` (its ``arrival_s`` is set to now); raises ``ValueError`` if the engine refuses it."""
        req.arrival_s = max(self.sim_now(), self.engine.now_s)
        self.engine.add(req)
        self._sinks[req.request_id] = (sink, choice)
        self._wake.set()

    def abort(self, request_id: str) -> bool:
        self._sinks.pop(request_id, None)
        return self.engine.abort(request_id)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        engine = self.engine
        while True:
            if not engine.has_work():
                self._wake.clear()
                await self._wake.wait()
                continue
            start_s = engine.now_s = max(engine.now_s, self.sim_now())
            try:
                out = engine.step()
            except Exception:
                self.step_errors += 1
                log.exception("engine step failed; aborting its requests")
                self.abort_all()
                continue
            end_s = start_s + out.duration_s
            # Sleep until the step's end rather than for its length, so our own overhead does not slow the clock.
            await self._clock.sleep(max(end_s - self.sim_now(), 0.0) / self._speedup)
            engine.now_s = end_s
            finished = set(out.finished)
            for rid, tokens in out.emitted.items():
                target = self._sinks.get(rid)
                if target is not None:
                    target[0].put_nowait(Delivery(target[1], tokens, rid in finished))
            for rid in finished:
                self._sinks.pop(rid, None)

    def abort_all(self) -> None:
        """Abort every request in the engine; each sink gets a failed last delivery."""
        for rid, (sink, choice) in list(self._sinks.items()):
            self.abort(rid)
            sink.put_nowait(Delivery(choice, 0, finished=True, failed=True))
