"""Metering: a request's cost and usage record, and the background writer that puts records in the ledger
without making the client wait — and without losing them.

**Tokens and latency.** Prompt and completion tokens come from the worker's usage block; a stream cut short
before it counts its completion tokens as the token events relayed. TTFT is from the request's arrival at the
gateway to its first token event, TPOT the mean gap between the first and the last token event (seconds).

**Cost method.** When the controller publishes the worker's cost per output token (``usd_per_mtok``, which
already includes the drafter and the rejected drafts), a request costs ``completion_tokens × usd_per_mtok / 1e6``.
Without a controller the gateway falls back to the fleet file's price and the throughput it observes:
the worker costs ``usd_per_second = gpus × usd_per_gpu_hour / 3600``; a request that kept the worker busy
for ``d`` seconds while ``n`` requests of this gateway were open on it is charged ``usd_per_second × d / n``
(equivalently its tokens at the observed aggregate throughput ``n × tokens / d``). With several replicas
each sees only its own share of the load, so this fallback overstates cost; the controller's figure does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable

from fleet.clock import Clock
from fleet.store.protocol import Store, UsageRecord
from gateway.metrics import GatewayMetrics
from gateway.pool import WorkerView
from gateway.sse import StreamMeter, Usage

log = logging.getLogger(__name__)


def request_cost(worker: WorkerView, *, completion_tokens: int, busy_s: float, concurrent: int) -> float:
    """USD charged for one request (see the module docstring for the method)."""
    state = worker.state
    if state is not None and state.usd_per_mtok is not None:
        return completion_tokens * state.usd_per_mtok / 1e6
    return worker.config.usd_per_second * max(busy_s, 0.0) / max(concurrent, 1)


def usage_record(
    *,
    request_id: str,
    tenant: str,
    model: str,
    worker: WorkerView,
    status: str,
    usage: Usage | None,
    stream: StreamMeter | None,
    busy_s: float,
    arrived_at: float,
    wall: float,
) -> UsageRecord:
    """The record of one finished request (``status``: ok, error or cancelled) that kept ``worker`` busy for
    ``busy_s`` seconds; ``arrived_at`` is the clock's monotonic time of its arrival, ``wall`` Unix seconds now.
    Call it while the request still counts in ``worker.in_flight`` (the cost shares the worker among them)."""
    prompt = usage.prompt_tokens if usage else 0
    completion = usage.completion_tokens if usage else (stream.token_events if stream else 0)
    ttft = tpot = None
    if stream is not None and stream.first_token_at is not None:
        ttft = stream.first_token_at - arrived_at
        if completion > 1 and stream.last_token_at is not None:
            tpot = (stream.last_token_at - stream.first_token_at) / (completion - 1)
    cost = request_cost(worker, completion_tokens=completion, busy_s=busy_s, concurrent=worker.in_flight)
    return UsageRecord(
        request_id=request_id,
        tenant=tenant,
        model=model,
        worker_id=worker.id,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cost_usd=cost,
        status=status,
        ttft_s=ttft,
        tpot_s=tpot,
        at=wall,
    )


Job = Callable[[], Awaitable[None]]
MAX_BATCH = 256
"""Most usage records written in one ``append_usage_many`` round trip."""


class LedgerWriter:
    """Runs store writes (ledger appends, and settlements the response path could not await) in the
    background, in order, retrying each until it succeeds. ``close`` drains what is queued. Records queued
    back to back go to the store together, in one ``append_usage_many`` round trip."""

    def __init__(self, store: Store, *, clock: Clock, metrics: GatewayMetrics, retry_s: float = 0.5) -> None:
        self._store = store
        self._clock = clock
        self._metrics = metrics
        self._retry_s = retry_s
        self._queue: asyncio.Queue[Job | UsageRecord] = asyncio.Queue()
        self._held: Job | UsageRecord | None = None
        """An item taken off the queue while batching records, to run next."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="gateway-ledger")

    def append(self, record: UsageRecord) -> None:
        self._queue.put_nowait(record)
        self._metrics.ledger_backlog.set(self._queue.qsize())

    def submit(self, job: Job) -> None:
        self._queue.put_nowait(job)
        self._metrics.ledger_backlog.set(self._queue.qsize())

    async def idle(self) -> None:
        """Wait until every queued job has run (tests, shutdown)."""
        await self._queue.join()

    async def _run(self) -> None:
        while True:
            item = self._held if self._held is not None else await self._queue.get()
            self._held = None
            if isinstance(item, UsageRecord):
                records = self._batch(item)
                await self._until_done(functools.partial(self._store.append_usage_many, records))
                done = len(records)
            else:
                await self._until_done(item)
                done = 1
            for _ in range(done):
                self._queue.task_done()
            self._metrics.ledger_backlog.set(self._queue.qsize())

    def _batch(self, first: UsageRecord) -> list[UsageRecord]:
        """``first`` and the records queued right behind it (up to ``MAX_BATCH``); a job met on the way is held."""
        records = [first]
        while len(records) < MAX_BATCH and not self._queue.empty():
            item = self._queue.get_nowait()
            if not isinstance(item, UsageRecord):
                self._held = item
                break
            records.append(item)
        return records

    async def _until_done(self, job: Job) -> None:
        delay = self._retry_s
        while True:
            try:
                await job()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store may be briefly away: keep the record and retry
                self._metrics.loop_errors.labels(loop="ledger").inc()
                log.warning("ledger write failed, retrying in %.1f s: %s", delay, exc)
                await self._clock.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def close(self, *, drain_s: float = 5.0) -> None:
        """Drain the queue for up to ``drain_s`` seconds, then stop; anything left is logged as lost."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain_s):
                await self._queue.join()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        lost = self._queue.qsize() + (self._held is not None)
        if lost:
            log.error("%d usage/settle writes could not be stored before shutdown", lost)
