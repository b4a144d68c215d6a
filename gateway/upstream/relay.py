"""Relaying a worker's answer to the client, and noticing when the client goes away.

``DisconnectGuard`` watches the ASGI ``receive`` channel for the whole call and cancels the request's task on
``http.disconnect``: before the response starts (admission, queueing at the worker, prefill, a whole
non-streaming generation) the cancellation surfaces as ``ClientDisconnected``; once a stream has started it is
simply the end of the call. Either way the cancellation unwinds through the request's hold on its worker,
which closes the upstream request, so the worker stops generating for nobody. The watcher task starts only
once the call has run for ``arm_after_s``: most requests to a fast upstream finish sooner, and a timer costs
far less than a task on the hot path (Starlette's streaming response spends two tasks and a cancel scope on
every stream to do the same). Nor does each guard arm a timer of its own: the guards of a loop wait in one
``_Arming``, whose one timer fires when the oldest is due, so a request that ends within ``arm_after_s`` costs a
dict entry, not a timer set and cancelled.

``stream`` passes the worker's events through as they complete (``gateway.upstream.sse.StreamMeter`` reads them on the
way) and reports how the stream ended; ``read_whole`` reads a whole answer. Neither meters nor releases
anything: the pipeline meters, and the hold (``gateway.upstream.client.Hold``) releases.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from types import TracebackType

import aiohttp
import orjson
from starlette.types import Receive, Send

from fleet.clock import Clock
from gateway.errors import ClientDisconnected, GatewayError, UpstreamFailed, UpstreamTimeout
from gateway.upstream.client import Hold
from gateway.upstream.sse import StreamMeter, Usage, usage_of

ARM_AFTER_S = 0.05
SSE_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
)


class DisconnectGuard:
    """``with DisconnectGuard(receive) as guard: …`` — the block is cancelled if the client disconnects
    meanwhile. Use only after the request body has been read (the guard consumes ``receive``). Set ``answering``
    once the response has started: a disconnect then ends the block quietly instead of raising
    ``ClientDisconnected`` (there is nobody left to answer)."""

    def __init__(self, receive: Receive | None, *, arm_after_s: float = ARM_AFTER_S) -> None:
        self._receive = receive
        self._arm_after_s = arm_after_s
        self._task: asyncio.Task[object] | None = None
        self._arming: _Arming | None = None
        """Where the guard waits to arm (None once armed)."""
        self._watch: asyncio.Task[None] | None = None
        self.fired = False
        self.answering = False

    def __enter__(self) -> DisconnectGuard:
        if self._receive is not None:
            self._task = asyncio.current_task()
            self._arming = _Arming.of(asyncio.get_running_loop())
            self._arming.add(self, self._arm_after_s)
        return self

    def _arm(self) -> None:
        self._arming = None
        if self._receive is not None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_receive(self._receive))

    async def _watch_receive(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.fired = True
        if self._task is not None:
            self._task.cancel()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if self._arming is not None:
            self._arming.discard(self)
        if self._watch is not None:
            self._watch.cancel()
        if self.fired and self._task is not None:
            self._task.uncancel()
            if exc_type is asyncio.CancelledError:
                if self.answering:
                    return True
                raise ClientDisconnected("The client closed the connection before the response.") from None
        return False


class _Arming:
    """The guards of one event loop that wait to arm, each due ``arm_after_s`` after it entered, and the one timer
    that arms them: it is set for the soonest due guard and, when it fires, arms every guard due by then and is set
    again for the soonest left. A guard that exits first only leaves the dict. Kept on the loop itself
    (``of``), so it lives and dies with it."""

    __slots__ = ("_due", "_loop", "_timer", "_timer_at")

    _ATTRIBUTE = "_gearshift_disconnect_arming"

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._due: dict[DisconnectGuard, float] = {}
        """Guard → loop time it is due to arm."""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _Arming:
        arming: _Arming | None = getattr(loop, cls._ATTRIBUTE, None)
        if arming is None:
            arming = cls(loop)
            setattr(loop, cls._ATTRIBUTE, arming)
        return arming

    def add(self, guard: DisconnectGuard, delay_s: float) -> None:
        when = self._due[guard] = self._loop.time() + delay_s
        if when < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._set(when)

    def discard(self, guard: DisconnectGuard) -> None:
        self._due.pop(guard, None)

    def _set(self, when: float) -> None:
        self._timer_at = when
        self._timer = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        due_by = max(self._timer_at, self._loop.time())  # the guards the timer was set for are due, as their own
        self._timer, self._timer_at = None, math.inf  #   timers would have been
        soonest = math.inf
        for guard, when in list(self._due.items()):
            if when <= due_by:
                del self._due[guard]
                guard._arm()
            elif when < soonest:
                soonest = when
        if soonest < math.inf:
            self._set(soonest)


async def stream(
    hold: Hold,
    meter: StreamMeter,
    send: Send,
    guard: DisconnectGuard,
    *,
    headers: Sequence[tuple[bytes, bytes]],
    clock: Clock,
    idle_timeout_s: float,
    total_timeout_s: float = float("inf"),
) -> GatewayError | None:
    """Send the response head (with ``headers``) and the worker's events as they complete, up to its
    ``[DONE]`` (held back: the caller ends the stream). Returns None at ``[DONE]``, or the failure that ended
    the stream early: nothing for ``idle_timeout_s`` seconds, more than ``total_timeout_s`` seconds in all, a broken
    connection, or an end without ``[DONE]``."""
    await send({"type": "http.response.start", "status": 200, "headers": [*SSE_HEADERS, *headers]})
    guard.answering = True
    content, worker, request_id, waits = hold.response.content, hold.worker.id, hold.request_id, hold.deadline
    streaming = "The upstream worker failed while streaming"
    chunk = hold.first_chunk
    deadline = clock.monotonic() + total_timeout_s
    while True:
        out = meter.feed(chunk, clock.monotonic())
        if out:
            await send({"type": "http.response.body", "body": out, "more_body": True})
        if meter.done:
            return None
        left = deadline - clock.monotonic()
        try:
            with waits.after(min(idle_timeout_s, max(left, 0.0))):
                chunk = await content.readany()
        except TimeoutError:
            if left <= idle_timeout_s:
                summary = f"The stream ran past its limit of {total_timeout_s:g} s"
                return UpstreamTimeout(f"worker {worker}: stream too long", request_id=request_id, summary=summary)
            summary = f"The upstream worker sent nothing for {idle_timeout_s:g} s while streaming"
            return UpstreamTimeout(f"worker {worker} went idle", request_id=request_id, summary=summary)
        except (aiohttp.ClientError, OSError) as exc:
            detail = f"worker {worker} failed mid-stream: {exc!r}"
            return UpstreamFailed(detail, request_id=request_id, summary=streaming)
        if not chunk:
            detail = f"worker {worker} ended the stream without [DONE]"
            return UpstreamFailed(detail, request_id=request_id, summary=streaming)


async def read_whole(hold: Hold, *, timeout_s: float) -> tuple[bytes, Usage | None]:
    """The rest of a whole (non-streamed, or error) answer within ``timeout_s`` seconds, and the usage block of
    a successful one; ``UpstreamFailed`` when the worker breaks off or a 200 answer is not JSON."""
    response, worker, request_id = hold.response, hold.worker.id, hold.request_id
    try:
        with hold.deadline.after(timeout_s):
            body = hold.first_chunk + await response.read()
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        detail = f"worker {worker} failed while answering: {exc!r}"
        summary = "The upstream worker failed while answering"
        raise UpstreamFailed(detail, request_id=request_id, summary=summary) from None
    if response.status != 200:
        return body, None
    try:
        return body, usage_of(orjson.loads(body))
    except orjson.JSONDecodeError:
        detail = f"worker {worker} answered 200 with a body that is not JSON"
        summary = "The upstream worker sent an answer that is not JSON"
        raise UpstreamFailed(detail, request_id=request_id, summary=summary) from None
