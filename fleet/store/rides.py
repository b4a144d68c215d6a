"""Rides: store calls that wait a moment for the next admit and go with it, in the same script call
(``RedisStore``; ``fleet.store.lua.BUNDLE`` runs them all in one round trip).

Why: a gateway that serves a sequential client makes one admit per request (its concurrency slot, exact); the ledger
write, the settlements, the lease renewals and the background reads (worker states, ejections, run-time tenants, the
replica heartbeat) would each cost a command of their own on top. Each of them can wait a little, and an admit comes
every few milliseconds while requests flow, so they ride on it: the store then runs one command per admit and none
besides.

A rider waits only while admits flow (the last one was sent within its wait) and at most its wait; then it goes
alone, exactly as it would have without rides. A settlement waits ``RIDE_S`` at most (another replica may wait for its
slot release), and so does a ledger append (a record in memory is lost with the process); the calls that only their own
loops wait for (lease grants, spend reads, background reads, the heartbeat) wait up to ``BACKGROUND_RIDE_S``, so that a
stalled moment of a loaded machine does not send them alone. A controller, which never admits, never waits. On a single
Redis any rider goes with any admit (one script may touch any key); on Redis Cluster only a rider whose keys live in the
admit's tenant slot (its ledger append, its settlements, its lease grants): the others go alone.

What a rider's caller sees is what the call alone would have given: its reply, its error (a failing rider does not
fail the others, nor the admit), or the carrying call's failure (a lost connection: the call may have run, as for any
store error; every riding call is one that may be repeated: ledger appends skip request ids already billed, settlements
skip settle ids already applied, reads change nothing). A caller cancelled while its rider waits takes it off.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

RIDE_S = 0.02
"""The longest a rider waits for an admit, seconds. A settlement's slot release reaches the store within
``settle_linger_s`` + this after the response (keep the sum under ``concurrency_grace_s``, 50 ms by default)."""

BACKGROUND_RIDE_S = 0.2
"""The longest a lease grant, a spend read, a background read or a heartbeat waits for an admit, seconds (each of them
is at least half a second ahead of need)."""

_ALONE = object()
"""A rider's result when no admit took it in time: its caller sends it alone."""


@dataclass(eq=False, slots=True)
class Rider:
    """One call waiting for an admit: a script of ``fleet.store.lua.BUNDLED`` with its KEYS and ARGV."""

    script: str
    keys: Sequence[str]
    args: Sequence[str]
    scope: str | None
    """The tenant whose cluster slot its keys live in; None: keys of fleet-wide slots (it rides on a single Redis)."""
    reply: asyncio.Future[Any]


class Rides:
    """The riders waiting for the next admit of one store. ``ride`` waits for one (or sends the call alone); the
    admit takes what it can carry (``take``) and resolves them (``deliver``, ``fail``)."""

    def __init__(self, *, wait_s: float = RIDE_S, scoped: bool = False) -> None:
        self.wait_s = wait_s
        self._scoped = scoped
        """Redis Cluster: a rider goes only with an admit of its own scope (slot)."""
        self.waiting: list[Rider] = []
        self._admit_at = -float("inf")
        """``time.monotonic()`` of the last admit sent."""

    def admitting(self) -> None:
        """An admit is being sent now (riders may wait for the next one)."""
        self._admit_at = time.monotonic()

    async def ride(
        self,
        script: str,
        keys: Sequence[str],
        args: Sequence[str],
        scope: str | None,
        alone: Callable[[], Awaitable[Any]],
        *,
        wait_s: float | None = None,
    ) -> Any:
        """The reply of ``script`` on ``keys`` and ``args``: carried by the next admit when one comes within
        ``wait_s`` (default: the queue's ``wait_s``; never more than that when it is 0) while admits flow, else
        ``alone()``."""
        wait_s = self.wait_s if wait_s is None or self.wait_s <= 0 else wait_s
        if wait_s <= 0 or (self._scoped and scope is None) or time.monotonic() - self._admit_at > wait_s:
            return await alone()
        loop = asyncio.get_running_loop()
        rider = Rider(script, keys, args, scope, loop.create_future())
        self.waiting.append(rider)
        timer = loop.call_later(wait_s, self._go_alone, rider)
        try:
            reply = await rider.reply
        finally:
            timer.cancel()
            self._off(rider)  # a cancelled caller's rider, still waiting
        if reply is _ALONE:
            return await alone()
        return reply

    def take(self, scope: str) -> list[Rider]:
        """The riders an admit of ``scope`` carries (they leave the queue)."""
        if not self._scoped:
            taken, self.waiting = self.waiting, []
            return taken
        taken = [r for r in self.waiting if r.scope == scope]
        if taken:
            self.waiting = [r for r in self.waiting if r.scope != scope]
        return taken

    def _go_alone(self, rider: Rider) -> None:
        if self._off(rider) and not rider.reply.done():
            rider.reply.set_result(_ALONE)

    def _off(self, rider: Rider) -> bool:
        for i, waiting in enumerate(self.waiting):
            if waiting is rider:
                del self.waiting[i]
                return True
        return False


def deliver(riders: Sequence[Rider], replies: Sequence[Any]) -> None:
    """Hand each carried rider its reply (an exception in its place: its error)."""
    for rider, reply in zip(riders, replies, strict=True):
        if rider.reply.done():  # its caller was cancelled
            continue
        if isinstance(reply, Exception):
            rider.reply.set_exception(reply)
        else:
            rider.reply.set_result(reply)


def fail(riders: Sequence[Rider], exc: Exception) -> None:
    """The call carrying ``riders`` failed as a whole: each caller sees its failure."""
    for rider in riders:
        if not rider.reply.done():
            rider.reply.set_exception(exc)
