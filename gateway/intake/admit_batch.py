"""Admits that still need the store, gathered per event-loop tick: every request of one tick that asks is answered
by one ``Store.admit_many`` (one round trip, pipelined on Redis) instead of one round trip each.

The first admit of a tick starts the task that sends the batch; that task's first step runs in the loop's next
iteration, after the rest of the current tick, and takes every admit queued by then: a lone request waits no longer
than the rest of its tick (no callback in between, which would cost an iteration more). A request cancelled while its
admit is in flight has its grant undone (slots released, window reservations refunded) once the answer comes: nothing
is left held for a request that is gone.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace

from fleet.store.protocol import Admission, Limit, Settlement, SlotLimit, Store, WindowLimit

_Call = tuple[Sequence[Limit], float, "asyncio.Future[Admission]"]


class AdmitBatcher:
    """``admit`` with ``Store.admit``'s signature, batched per tick."""

    def __init__(self, store: Store, *, on_undo_error: Callable[[], None] = lambda: None) -> None:
        self._store = store
        self._pending: list[_Call] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._on_undo_error = on_undo_error

    async def admit(self, limits: Sequence[Limit], *, now: float) -> Admission:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Admission] = loop.create_future()
        self._pending.append((limits, now, future))
        if len(self._pending) == 1:
            task = asyncio.ensure_future(self._send_pending())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _send_pending(self) -> None:
        batch, self._pending = self._pending, []
        await self._send(batch)

    async def _send(self, batch: list[_Call]) -> None:
        try:
            if len(batch) == 1:
                results = [await self._store.admit(batch[0][0], now=batch[0][1])]
            else:
                results = await self._store.admit_many([(limits, now) for limits, now, _ in batch])
        except Exception as exc:
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        undo: list[Settlement] = []
        for (limits, now, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
            elif result.allowed:  # the request was cancelled meanwhile: give back what it was granted
                undo.append(_undo(limits, now))
        if undo:
            try:
                await self._store.settle_many(undo, now=batch[-1][1])
            except Exception:  # the slots expire by their TTL, the reservations leave their windows
                self._on_undo_error()

    async def idle(self) -> None:
        """Until every batch sent has been answered (tests)."""
        while self._tasks or self._pending:
            await asyncio.sleep(0)
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)


def _undo(limits: Sequence[Limit], now: float) -> Settlement:
    windows = tuple(replace(w, cost=-w.cost, reserved_at=now) for w in limits if isinstance(w, WindowLimit) and w.cost)
    slots = tuple(s for s in limits if isinstance(s, SlotLimit))
    return Settlement(settle_id=f"undo-{uuid.uuid4().hex}", windows=windows, slots=slots)
