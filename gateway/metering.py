"""Metering: a request's cost and usage record, and the background writer that puts records in the ledger
without making the client wait — and without losing them (a store outage spools them to disk, ``gateway.spool``).

**Tokens and latency.** Prompt and completion tokens come from the worker's usage block; a stream cut short
before it counts the running usage its last chunks carried (``gateway.sse.StreamMeter``). TTFT is from the
request's arrival at the gateway to its first chunk, TPOT the time from the first to the last chunk over the
completion tokens after the first (seconds per token: a chunk carries up to k + 1 tokens under speculation).

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
from gateway.spool import Spool
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
    now: float,
    tier: str | None = None,
) -> UsageRecord:
    """The record of one finished request (``status``: ok, error or cancelled) that kept ``worker`` busy for
    ``busy_s`` seconds; ``arrived_at`` is the clock's monotonic time of its arrival, ``now`` the monotonic time
    and ``wall`` Unix seconds now.
    Call it while the request still counts in ``worker.in_flight`` (the cost shares the worker among them)."""
    prompt = usage.prompt_tokens if usage else (stream.prompt_tokens if stream else 0)
    completion = usage.completion_tokens if usage else (stream.completion_tokens if stream else 0)
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
        arrived_at=wall - (now - arrived_at),
        tier=tier,
    )


Job = Callable[[], Awaitable[None]]
MAX_BATCH = 256
"""Most usage records written in one ``append_usage_many`` round trip."""


class LedgerWriter:
    """Writes usage records to the ledger and runs the settlements the response path could not await, in the
    background. Records queued back to back go to the store together (one ``append_usage_many`` round trip).

    With a ``spool``, records the store cannot take are appended to it (durable on disk) and replayed in order,
    once each, by a replay task when the store is back; a new record waits behind spooled ones, so the ledger
    sees them in order. Without one (or when it is full: the alarm is logged and the metric set), they are
    retried in memory. Settlements (window refunds, slot releases, spend) are retried in memory on their own
    task, so a failing one never holds records back from the spool. ``close`` drains what is queued and spools
    the records still in memory."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock,
        metrics: GatewayMetrics,
        spool: Spool | None = None,
        retry_s: float = 0.5,
    ) -> None:
        self._store = store
        self._clock = clock
        self._metrics = metrics
        self._spool = spool
        self._retry_s = retry_s
        self._records: asyncio.Queue[UsageRecord] = asyncio.Queue()
        self._jobs: asyncio.Queue[Job] = asyncio.Queue()
        self._spooled = asyncio.Event()
        """Set when records were spooled, to wake the replay task."""
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._run_records(), name="gateway-ledger"),
            asyncio.create_task(self._run_jobs(), name="gateway-settle"),
        ]
        if self._spool is not None:
            self._tasks.append(asyncio.create_task(self._replay(self._spool), name="gateway-spool"))
            self._spooled.set()  # a previous process may have left records in it

    def append(self, record: UsageRecord) -> None:
        self._records.put_nowait(record)
        self._backlog()

    def submit(self, job: Job) -> None:
        self._jobs.put_nowait(job)
        self._backlog()

    async def idle(self) -> None:
        """Wait until every queued record is in the store or the spool and every queued job has run."""
        await self._records.join()
        await self._jobs.join()

    def spool_detail(self) -> dict[str, int]:
        """``spool_bytes`` (usage waiting in the spool) when there is a spool, else nothing."""
        return {} if self._spool is None else {"spool_bytes": self._spool.size_bytes()}

    def _backlog(self) -> None:
        self._metrics.ledger_backlog.set(self._records.qsize() + self._jobs.qsize())

    # records ---------------------------------------------------------------------------------------------
    async def _run_records(self) -> None:
        while True:
            records = [await self._records.get()]
            while len(records) < MAX_BATCH and not self._records.empty():
                records.append(self._records.get_nowait())
            await self._write(records)
            for _ in records:
                self._records.task_done()
            self._backlog()

    async def _write(self, records: list[UsageRecord]) -> None:
        spool = self._spool
        if spool is None:
            await self._until_done(functools.partial(self._store.append_usage_many, records))
            return
        if not spool.has_pending():
            try:
                await self._store.append_usage_many(records)
                self._metrics.store_up.set(1)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store is away: the spool keeps the records
                self._failed("ledger", exc)
        if self._spool_records(spool, records):
            return
        await self._until_done(functools.partial(self._store.append_usage_many, records))

    def _spool_records(self, spool: Spool, records: list[UsageRecord]) -> bool:
        """Durably spool ``records``; False (alarm logged once, metric set) when the spool is full."""
        was_full = spool.full
        if spool.append(records):
            self._spooled.set()
            self._spool_metrics(spool)
            return True
        if not was_full:
            log.error("usage spool is full (%d bytes): usage records now wait in memory", spool.size_bytes())
        self._spool_metrics(spool)
        return False

    async def _replay(self, spool: Spool) -> None:
        """Put spooled records into the store, oldest first, as soon as it takes them."""
        delay = self._retry_s
        while True:
            if not spool.has_pending():
                self._spooled.clear()
                self._spool_metrics(spool)
                await self._spooled.wait()
                continue
            records, end = spool.pending(MAX_BATCH)
            try:
                await self._store.append_usage_many(records)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # still away: try again later, the records stay spooled
                self._failed("spool", exc)
                await self._clock.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            spool.commit(end)
            self._metrics.store_up.set(1)
            delay = self._retry_s

    def _spool_metrics(self, spool: Spool) -> None:
        self._metrics.spool_bytes.set(spool.size_bytes() if spool.has_pending() else 0)
        self._metrics.spool_full.set(1 if spool.full else 0)

    # settlements -----------------------------------------------------------------------------------------
    async def _run_jobs(self) -> None:
        while True:
            job = await self._jobs.get()
            await self._until_done(job)
            self._jobs.task_done()
            self._backlog()

    async def _until_done(self, job: Job) -> None:
        delay = self._retry_s
        while True:
            try:
                await job()
                self._metrics.store_up.set(1)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store may be briefly away: keep the write and retry
                self._failed("ledger", exc)
                log.warning("ledger write failed, retrying in %.1f s: %s", delay, exc)
                await self._clock.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _failed(self, loop: str, exc: Exception) -> None:
        self._metrics.loop_errors.labels(loop=loop).inc()
        self._metrics.store_up.set(0)
        log.debug("store write failed: %s", exc)

    # shutdown --------------------------------------------------------------------------------------------
    async def close(self, *, drain_s: float = 5.0) -> None:
        """Drain the queues for up to ``drain_s`` seconds, then stop. Records still in memory go to the spool
        (when there is one, and it has room); anything left after that is logged as lost."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain_s):
                await self.idle()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        records = [self._records.get_nowait() for _ in range(self._records.qsize())]
        if records and self._spool is not None and self._spool_records(self._spool, records):
            log.warning("%d usage records spooled at shutdown, replayed at the next start", len(records))
            records = []
        lost = len(records) + self._jobs.qsize()
        if lost:
            log.error("%d usage/settle writes could not be stored before shutdown", lost)
