"""Overload control: a bounded queue per model (its worker pool) in front of the workers, admitting a request
to a worker only while the pool has headroom. The queue's policy — priority bands, deficit round robin
between tenants, which request is refused — is ``gateway.intake.fairqueue``; this module is the mechanism.

**Headroom.** A worker's free slots are ``ceil(max_occupancy · max_num_seqs − load − prefill_tokens /
prefill_tokens_per_slot)`` (0 when that is ≤ 0, or when its published ``kv_usage ≥ overload_kv_threshold``),
— the queue scorer's occupancy (``gateway.routing.pool.occupancy``), kept below ``overload_max_occupancy``
(and, for a worker in a pool of the fleet plan, below its ``max_concurrency``). A request's candidates have
headroom while the free slots of those still routable (``gateway.routing.filters.eligibility.routable``) exceed
the requests already dispatched to them from the queue that have not yet reached a worker. Each queued request
waits on its own candidates — the router's choice for it, placement included — so a batch request whose pool is
at its cap is not released because an interactive worker has room.

**The slot.** ``async with gate.slot(req, principal, ranked) as queued:`` is the pipeline's one use of the gate: its
entry waits (``enter``), its exit pokes the queue (the call's worker may have room again). With the model's
queue empty and headroom on the candidates, the entry returns at once: no queue, no future, no allocation.
Otherwise the request queues and waits for ``dispatch``, which runs whenever capacity may have come back (a
worker's first byte, through ``WorkerPool.on_prefill_done``; the end of a call, at the slot's exit) and on every
tick (``overload_tick_s``).

**Refusals** (counted in ``gearshift_gateway_shed_requests_total{tier, reason}``):

- ``predicted_ttft``: a sheddable tier's request whose predicted queued time — the entries ahead of it (its
  band and more important ones) ÷ the queue's recent dispatch rate — exceeds its ``ttft_target_s``: 429.
- ``queue_full``: the queue is full and no less deserving entry can be evicted: 429 if sheddable, else 503.
- ``evicted``: a queued sheddable entry that a more deserving arrival displaced: 429.
- ``ttft_target`` / ``max_wait``: a sheddable request still queued at its TTFT target (or, without one,
  ``overload_max_wait_s``): 429.
- ``wait_timeout``: a non-sheddable request still queued at its TTFT target (or ``overload_max_wait_s``): 503.

Every 429 carries ``Retry-After`` and ``x-gearshift-limit: overload``, every 503 ``Retry-After``; the delay is the
queue's predicted drain time, clamped to [1, 60] s.

**Limits stay exact.** A request is admitted (``gateway.intake.admission``) before it queues, so while queued it holds
its tenant's concurrency slot and its RPM/TPM reservation: a tenant's ``max_concurrency`` bounds what it has
queued and running together. A refused request never reaches a worker: its ticket is settled with 0 tokens
(the TPM reservation refunded, the slot released) by the pipeline's ``abandon`` and no usage record is written,
like any failure before a worker answers. A dispatched request is metered once, by its call.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from fleet.clock import Clock
from fleet.config import TierConfig
from gateway.errors import FleetOverloaded, GatewayError, Shed
from gateway.intake.auth import Principal
from gateway.intake.brownout import Brownout, cap_max_tokens
from gateway.intake.fairqueue import Entry, FairQueue
from gateway.routing.filters.eligibility import routable
from gateway.routing.pool import WorkerPool, WorkerView, occupancy
from gateway.settings import GatewaySettings
from gateway.upstream.body import CompletionRequest
from gateway.usage.metrics import GatewayMetrics

SHED_REASONS = ("predicted_ttft", "queue_full", "evicted", "ttft_target", "max_wait", "wait_timeout")
"""Every refusal reason (a bounded metric label)."""
_RETRY_AFTER_MAX_S = 60.0
_RATE_SAMPLES = 4096
"""Dispatch times kept per model for the drain rate (the window trims them further)."""


@dataclass(frozen=True, slots=True)
class Claim:
    """Who asks the gate for a slot: the request's model, tenant and tier, and its reserved tokens (its DRR cost)."""

    model: str
    tenant: str
    tier_name: str
    tier: TierConfig
    tokens: int


@dataclass(eq=False, slots=True)
class Waiter:
    """What a queued request waits on: its future is resolved by ``dispatch`` (or failed with its refusal) once
    one of its ``candidates`` has a free slot; ``seat`` is then the worker id its dispatch counts against."""

    future: asyncio.Future[None]
    tier_name: str
    tier: TierConfig
    candidates: Sequence[WorkerView]
    seat: str | None = None


def free_slots(worker: WorkerView, *, max_occupancy: float, kv_threshold: float, prefill_tokens_per_slot: int) -> int:
    """New requests ``worker`` may take now (the module docstring's headroom)."""
    if worker.state is not None and worker.state.kv_usage >= kv_threshold:
        return 0
    slots = max_occupancy * worker.config.max_num_seqs
    if worker.pool is not None and worker.pool.max_concurrency is not None:  # the fleet plan's cap
        slots = min(slots, worker.pool.max_concurrency)
    room = slots - occupancy(worker, prefill_tokens_per_slot)
    return math.ceil(room) if room > 0 else 0


class Slot:
    """``async with gate.slot(claim, ranked) as queued:`` — the entry waits for headroom on ``ranked`` (``queued``:
    None on the fast path, else the seconds it queued; raises the refusal), the exit dispatches what the released
    capacity allows."""

    __slots__ = ("_claim", "_gate", "_ranked")

    def __init__(self, gate: OverloadGate, claim: Claim, ranked: Sequence[WorkerView]) -> None:
        self._gate, self._claim, self._ranked = gate, claim, ranked

    async def __aenter__(self) -> float | None:
        return await self._gate.enter(self._claim, self._ranked)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._gate.poke(self._claim.model)


class OverloadGate:
    """The overload queues of every model, their dispatch, and the brownout switch."""

    def __init__(self, pool: WorkerPool, *, settings: GatewaySettings, metrics: GatewayMetrics, clock: Clock) -> None:
        self._pool = pool
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self._queues: dict[str, FairQueue[Waiter]] = {}
        self._pending: dict[str, int] = {}
        """Per worker id: requests dispatched from the queue against it whose task has not resumed yet (they hold
        no worker yet)."""
        self._dispatched: dict[str, deque[float]] = {}
        """Monotonic times of recent dispatches, per model (the drain-rate window)."""
        self.brownout = Brownout(
            mode="auto" if settings.brownout_auto else "off",
            after_s=settings.brownout_after_s,
            recover_s=settings.brownout_recover_s,
        )
        pool.on_prefill_done.append(self.poke)  # a worker's prefill ended: it may have room again

    # ------------------------------------------------------------------------------------ the pipeline's
    def brownout_cap(self, req: CompletionRequest, tier: TierConfig) -> None:
        """Cap a new request's ``max_tokens`` to its tier's ``brownout_max_tokens`` while the brownout is on."""
        if self.brownout.active:
            cap_max_tokens(req, tier, default_max_tokens=self._settings.default_max_tokens)

    def slot(self, req: CompletionRequest, principal: Principal, ranked: Sequence[WorkerView]) -> Slot:
        """The request's use of the gate (``Slot``); ``ranked`` are the router's candidates for it."""
        claim = Claim(req.model, principal.tenant.id, principal.tier_name, principal.tier, req.reserved_tokens)
        return Slot(self, claim, ranked)

    async def enter(self, claim: Claim, ranked: Sequence[WorkerView]) -> float | None:
        """Return once the request may go to one of ``ranked``: None at once on the fast path, else the seconds it
        queued. Raises ``Shed`` (429) or ``FleetOverloaded`` (503) when it is refused."""
        if not self._settings.overload_control:
            return None
        queue = self._queues.get(claim.model)
        if not queue and self._headroom(ranked) > 0:
            return None
        return await self._wait(claim, ranked)

    def poke(self, model: str) -> None:
        """Capacity may have come back on ``model``'s workers: dispatch what the headroom allows."""
        if self._queues.get(model):
            self.dispatch(model)

    # --------------------------------------------------------------------------------------- mechanism
    def _free(self, worker: WorkerView) -> int:
        """``worker``'s free slots less the dispatches counted against it that have not reached it yet."""
        s = self._settings
        free = free_slots(
            worker,
            max_occupancy=s.overload_max_occupancy,
            kv_threshold=s.overload_kv_threshold,
            prefill_tokens_per_slot=s.prefill_tokens_per_slot,
        )
        return free - self._pending.get(worker.id, 0)

    def _headroom(self, workers: Sequence[WorkerView]) -> int:
        """Free slots on the routable ones of ``workers`` (a request's candidates)."""
        now = self._clock.wall()
        return sum(self._free(w) for w in workers if routable(w, now))

    def _queue(self, model: str) -> FairQueue[Waiter]:
        queue = self._queues.get(model)
        if queue is None:
            s = self._settings
            queue = self._queues[model] = FairQueue(
                capacity=s.overload_queue_size, quantum_tokens=s.overload_quantum_tokens
            )
            self._dispatched[model] = deque(maxlen=_RATE_SAMPLES)
        return queue

    async def _wait(self, claim: Claim, ranked: Sequence[WorkerView]) -> float:
        model, tier, tier_name = claim.model, claim.tier, claim.tier_name
        queue = self._queue(model)
        now = self._clock.monotonic()
        if tier.sheddable and tier.ttft_target_s is not None:
            predicted = self._predicted_wait(model, queue.ahead_of(tier.priority) + 1, now)
            if predicted is not None and predicted > tier.ttft_target_s:
                raise self._refusal(model, tier_name, tier, "predicted_ttft", waited_s=0.0)
        waiter = Waiter(asyncio.get_running_loop().create_future(), tier_name, tier, ranked)
        budget = tier.ttft_target_s if tier.ttft_target_s is not None else self._settings.overload_max_wait_s
        entry = Entry(claim.tenant, tier.priority, tier.sheddable, max(1, claim.tokens), now, now + budget, waiter)
        queued, evicted = queue.offer(entry)
        if evicted is not None:
            self._refuse(model, evicted, "evicted", now)
        if not queued:
            raise self._refusal(model, tier_name, tier, "queue_full", waited_s=0.0)
        self._publish(model)
        self.dispatch(model)
        try:
            await waiter.future
        except asyncio.CancelledError:
            if queue.remove(entry):
                self._publish(model)
            elif waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                self._resumed(waiter)  # dispatched, then the client left before it ran: pass its turn on
                self.poke(model)
            raise
        self._resumed(waiter)
        waited = self._clock.monotonic() - now
        self._metrics.child(self._metrics.queued_time, tier_name).observe(waited)
        return waited

    def _resumed(self, waiter: Waiter) -> None:
        """A dispatched request runs again; it takes its worker before it next yields (route and the hold's
        creation in ``Upstream.open`` do not suspend), so the worker's own counts take over from here."""
        if waiter.seat is not None:
            self._pending[waiter.seat] -= 1

    def _seat(self, waiter: Waiter) -> str | None:
        """The routable candidate of ``waiter`` with the most free slots, if any has one."""
        now = self._clock.wall()
        best, most = None, 0
        for w in waiter.candidates:
            if routable(w, now) and (free := self._free(w)) > most:
                best, most = w.id, free
        return best

    def dispatch(self, model: str) -> None:
        """Resolve queued requests, most deserving first, each while one of its own candidates has a free slot
        (a request whose candidates are all full waits and lets the next one go)."""
        queue = self._queues.get(model)
        if not queue:
            return
        now = self._clock.monotonic()
        times = self._dispatched[model]
        while queue:
            entry = queue.pop(ready=lambda e: e.item.future.done() or self._seat(e.item) is not None)
            if entry is None:
                break
            waiter = entry.item
            if waiter.future.done():  # cancelled between its cancellation and its own cleanup
                continue
            waiter.seat = self._seat(waiter)
            assert waiter.seat is not None
            waiter.future.set_result(None)
            self._pending[waiter.seat] = self._pending.get(waiter.seat, 0) + 1
            times.append(now)
        self._publish(model)

    async def tick(self) -> None:
        """One tick: refuse what waited too long, dispatch what headroom allows, update the brownout."""
        now = self._clock.monotonic()
        for model, queue in self._queues.items():
            for entry in queue.expired(now):
                tier = entry.item.tier
                reason = "wait_timeout" if not tier.sheddable else "ttft_target" if tier.ttft_target_s else "max_wait"
                self._refuse(model, entry, reason, now)
            self.dispatch(model)
        self.brownout.observe(overloaded=any(self._queues.values()), now=now)
        self._metrics.brownout.set(1.0 if self.brownout.active else 0.0)

    def _refuse(self, model: str, entry: Entry[Waiter], reason: str, now: float) -> None:
        waiter = entry.item
        if waiter.future.done():
            return
        waiter.future.set_exception(
            self._refusal(model, waiter.tier_name, waiter.tier, reason, waited_s=now - entry.enqueued_at)
        )
        self._publish(model)

    def _refusal(self, model: str, tier_name: str, tier: TierConfig, reason: str, *, waited_s: float) -> GatewayError:
        """The error for a refused request (counted here), 429 for a sheddable tier and 503 otherwise."""
        self._metrics.child(self._metrics.shed, tier_name, reason).inc()
        self._metrics.child(self._metrics.queued_time, tier_name).observe(waited_s)
        retry = self._retry_after(model)
        message = (
            f"The '{model}' workers are overloaded ({reason}, queued {waited_s:.2f} s); retry after {retry:.0f} s."
        )
        if tier.sheddable:
            return Shed(message, retry_after_s=retry)
        return FleetOverloaded(message, retry_after_s=retry)

    def _rate(self, model: str, now: float) -> float | None:
        """Dispatches per second over the last ``overload_rate_window_s``; None before there are two."""
        times = self._dispatched.get(model)
        if times is None:
            return None
        while times and times[0] < now - self._settings.overload_rate_window_s:
            times.popleft()
        span = now - times[0] if times else 0.0
        return len(times) / span if len(times) >= 2 and span > 0 else None

    def _predicted_wait(self, model: str, ahead: int, now: float) -> float | None:
        rate = self._rate(model, now)
        return ahead / rate if rate else None

    def _retry_after(self, model: str) -> float:
        queue = self._queues.get(model)
        drain = self._predicted_wait(model, len(queue) if queue else 0, self._clock.monotonic())
        return min(_RETRY_AFTER_MAX_S, max(1.0, drain or 1.0))

    def _publish(self, model: str) -> None:
        queue = self._queues[model]
        for band in queue.bands():
            self._metrics.child(self._metrics.queue_depth, model, str(band)).set(queue.depth(band))

    # ------------------------------------------------------------------------------------------ views
    def depth(self, model: str) -> int:
        """Requests queued for ``model``."""
        queue = self._queues.get(model)
        return len(queue) if queue else 0
