"""Metering: a request's cost and usage record, and the background writer that puts records in the ledger
without making the client wait — and without losing them (a store outage spools them to disk, ``gateway.usage.spool``).

**Tokens and latency.** Prompt and completion tokens come from the worker's usage block; a stream cut short
before it counts the running usage its last chunks carried (``gateway.upstream.sse.StreamMeter``). TTFT is from the
request's arrival at the gateway to its first chunk, TPOT the time from the first to the last chunk over the
completion tokens after the first (seconds per token: a chunk carries up to k + 1 tokens under speculation).

**Cost method.** When the controller publishes the worker's cost per output token (``usd_per_mtok``, which
already includes the drafter and the rejected drafts), a request costs ``completion_tokens × usd_per_mtok / 1e6``.
Without a controller the gateway falls back to the fleet file's price and the throughput it observes:
the worker costs ``usd_per_second = gpus × usd_per_gpu_hour / 3600``; a request that kept the worker busy
for ``d`` seconds while ``n`` requests of this gateway were open on it is charged ``usd_per_second × d / n``
(equivalently its tokens at the observed aggregate throughput ``n × tokens / d``). With several replicas
each sees only its own share of the load, so this fallback overstates cost; the controller's figure does not.

**Prompt prices.** On top of that work cost, a model's ``pricing`` (fleet file) charges
``(prompt − cached) × prompt_usd_per_mtok / 1e6 + cached × prompt_usd_per_mtok × (1 − cached_prompt_discount) / 1e6``,
``cached`` being the prompt tokens the worker served from its prefix cache (``prompt_tokens_details.cached_tokens``,
recorded in ``UsageRecord.cached_tokens``). Both prices are 0 unless configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

from fleet.clock import Clock
from fleet.config import PricingConfig
from fleet.store.memory import in_process
from fleet.store.protocol import Settlement, Store, UsageRecord
from gateway.routing.pool import WorkerView
from gateway.settings import GatewaySettings
from gateway.upstream.sse import StreamMeter, Usage
from gateway.usage.metrics import GatewayMetrics
from gateway.usage.spool import Journal, JsonlSpool, SettlementSpool, Spool

if TYPE_CHECKING:  # the admitter hears what landed; it never imports the writer
    from gateway.intake.admission import Admitter

log = logging.getLogger(__name__)


def request_cost(
    worker: WorkerView,
    *,
    completion_tokens: int,
    busy_s: float,
    concurrent: int,
    prompt_tokens: int = 0,
    cached_tokens: int = 0,
    pricing: PricingConfig | None = None,
) -> float:
    """USD charged for one request (see the module docstring for the method)."""
    prompt_usd = 0.0
    if pricing is not None:
        cached = min(max(cached_tokens, 0), prompt_tokens)
        prompt_usd = (prompt_tokens - cached) * pricing.prompt_usd_per_mtok / 1e6
        prompt_usd += cached * pricing.cached_prompt_usd_per_mtok / 1e6
    state = worker.state
    if state is not None and state.usd_per_mtok is not None:
        return completion_tokens * state.usd_per_mtok / 1e6 + prompt_usd
    return worker.config.usd_per_second * max(busy_s, 0.0) / max(concurrent, 1) + prompt_usd


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
    workload: str | None = None,
    pricing: PricingConfig | None = None,
    session: str | None = None,
    admitted_at: float | None = None,
    speculation: str | None = None,
) -> UsageRecord:
    """The record of one finished request (``status``: ok, error or cancelled) that kept ``worker`` busy for
    ``busy_s`` seconds; ``arrived_at`` is the clock's monotonic time of its arrival, ``now`` the monotonic time
    and ``wall`` Unix seconds now; ``speculation`` its speculation mode (``auto``, ``off``, ``fast``).
    Call it while the request still counts in ``worker.in_flight`` (the cost shares the worker among them)."""
    prompt = usage.prompt_tokens if usage else (stream.prompt_tokens if stream else 0)
    completion = usage.completion_tokens if usage else (stream.completion_tokens if stream else 0)
    ttft = tpot = None
    if stream is not None and stream.first_token_at is not None:
        ttft = stream.first_token_at - arrived_at
        if completion > 1 and stream.last_token_at is not None:
            tpot = (stream.last_token_at - stream.first_token_at) / (completion - 1)
    cached = usage.cached_tokens if usage else 0  # a stream cut short before its usage chunk: none known
    cost = request_cost(
        worker, completion_tokens=completion, busy_s=busy_s, concurrent=worker.in_flight,
        prompt_tokens=prompt, cached_tokens=cached, pricing=pricing,
    )  # fmt: skip
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
        workload=workload,
        cached_tokens=cached,
        session=session,
        admitted_at=admitted_at,
        speculation=speculation,
    )


MAX_BATCH = 256
"""Most usage records (or settlements) written in one store round trip."""
T = TypeVar("T")
U = TypeVar("U")


def _within(write: Callable[[list[T]], Awaitable[None]], timeout_s: float) -> Callable[[list[T]], Awaitable[None]]:
    """``write`` with a deadline of ``timeout_s`` seconds: a store that hangs (a lost reply, a frozen node) fails the
    write like one that refuses, so the batch is spooled or retried. The write may have run: the store skips a record's
    request id, and a settlement's id, that it already has."""

    async def bounded(batch: list[T]) -> None:
        deadline = asyncio.timeout(timeout_s)
        try:
            async with deadline:
                await write(batch)
        except TimeoutError:
            if deadline.expired():
                raise TimeoutError(f"the store did not answer within {timeout_s} s") from None
            raise

    return bounded


def _report_stop(task: asyncio.Task[None]) -> None:
    """A lane's task ended otherwise than by its cancellation: say so (a lane never ends by itself)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("%s stopped: its entries are no longer written", task.get_name(), exc_info=exc)


class _Lane(Generic[T]):
    """One kind of write (usage records, or settlements) on its way to the store: queued, written in batches of up
    to ``MAX_BATCH`` by ``write``, and, while the store is away, durably spooled (``spool``) and replayed in order by
    ``replay``; without a spool (or when it is full) a failed batch is retried in memory. ``landed`` hears every
    batch the store has taken.

    A lane never stops and never drops an entry on an error of its own steps (a defect, not the store's failure: a
    callback that raises, a spool or journal file that fails): the error is logged with its traceback and counted
    (``loop_errors``), and the batch is kept and tried again; what ``landed``, ``durable`` or ``prepare`` raise is
    logged and passed over (the entries are stored, or written unprepared).

    A batch waits ``linger_s`` after its first entry before it is written, so that entries arriving one at a time
    (a sequential client) share a write: at most one write per ``linger_s`` while entries keep coming, none while
    they do not. An ``urgent`` entry (a settlement that corrects a window: the client's next request may need the
    room) is written without waiting and cuts a linger short. ``prepare`` turns the batch into what is written at
    that moment (the settlements drop the slots that admits have freed meanwhile, ``Admitter.unsettled``); an empty
    result writes nothing."""

    def __init__(
        self,
        name: str,
        writer: LedgerWriter,
        *,
        write: Callable[[list[T]], Awaitable[None]],
        spool: JsonlSpool[T] | None,
        landed: Callable[[Sequence[T]], None],
        linger_s: float = 0.0,
        prepare: Callable[[list[T]], list[T]] | None = None,
        urgent: Callable[[T], bool] | None = None,
        durable: Callable[[int], None] | None = None,
    ) -> None:
        self.name, self._w, self._write, self.spool, self._landed = name, writer, write, spool, landed
        self._durable = durable
        """Hears how many entries, the oldest taken, are now in the store or the spool (the journal's ``done``)."""
        self._linger_s = linger_s
        self._prepare = prepare
        self._urgent = urgent
        self._urgent_queued = 0
        self._wake = asyncio.Event()
        """Set when an urgent entry is queued: ends a linger."""
        self.queue: asyncio.Queue[T] = asyncio.Queue()
        self.writing: list[T] = []
        """The batch being written now (``close`` spools it if the writer is stopped mid-write)."""
        self._spooled = asyncio.Event()
        """Set when entries were spooled, to wake the replay task."""
        self.drained = asyncio.Event()
        """Set while the spool holds nothing the store lacks."""
        if spool is None or not spool.has_pending():
            self.drained.set()

    def tasks(self) -> list[asyncio.Task[None]]:
        tasks = [asyncio.create_task(self._run(), name=f"gateway-{self.name}")]
        if self.spool is not None:
            tasks.append(asyncio.create_task(self._replay(self.spool), name=f"gateway-{self.name}-spool"))
            self._spooled.set()  # a previous process may have left entries in it
        for task in tasks:
            task.add_done_callback(_report_stop)
        return tasks

    async def _run(self) -> None:
        while True:
            batch = self.writing = [self._took(await self.queue.get())]  # ``close`` spools it if stopped meanwhile
            if self._linger_s > 0 and not self._urgent_queued and not self._is_urgent(batch[0]):
                await self._linger()
            while len(batch) < MAX_BATCH and not self.queue.empty():
                batch.append(self._took(self.queue.get_nowait()))
            await self._keep(batch)
            if self._durable is not None:
                self._heard(self._durable, len(batch), "durable")
            self.writing = []
            for _ in batch:
                self.queue.task_done()
            self._w.backlog()

    def put(self, entry: T) -> None:
        self.queue.put_nowait(entry)
        if self._is_urgent(entry):
            self._urgent_queued += 1
            self._wake.set()

    def _is_urgent(self, entry: T) -> bool:
        return self._urgent is not None and self._urgent(entry)

    def _took(self, entry: T) -> T:
        if self._is_urgent(entry):
            self._urgent_queued -= 1
        return entry

    async def _linger(self) -> None:
        """``linger_s`` on the clock, or less when an urgent entry comes meanwhile."""
        self._wake.clear()
        sleeping = asyncio.ensure_future(self._w.clock.sleep(self._linger_s))
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait((sleeping, woken), return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeping.cancel()
            woken.cancel()

    async def _keep(self, batch: list[T]) -> None:
        """Put ``batch`` in the store or the spool; tried again after a back-off while a step of the lane fails."""
        delay = self._w.retry_s
        while True:
            try:
                todo = batch if self._prepare is None else self._prepared(batch, self._prepare)
                if todo:
                    await self._put(todo)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                self._w.unexpected(self.name)
                log.exception("%s writer: unexpected error; its %d entries are kept and tried again in %.1f s",
                              self.name, len(batch), delay)  # fmt: skip
                await self._w.clock.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _prepared(self, batch: list[T], prepare: Callable[[list[T]], list[T]]) -> list[T]:
        try:
            return prepare(batch)
        except Exception:
            self._w.unexpected(self.name)
            log.exception("%s writer: preparing a batch failed; its %d entries are written as they are",
                          self.name, len(batch))  # fmt: skip
            return batch

    def _heard(self, callback: Callable[[U], None], what: U, name: str) -> None:
        """Tell ``callback`` (``landed``, ``durable``) about entries now stored or spooled; an error of its own is
        logged and does not undo that."""
        try:
            callback(what)
        except Exception:
            self._w.unexpected(self.name)
            log.exception("%s writer: its %s callback failed (the entries are stored or spooled)", self.name, name)

    async def _put(self, batch: list[T]) -> None:
        spool = self.spool
        if spool is None or not spool.has_pending():  # with entries spooled, new ones queue behind them
            try:
                await self._write(batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store is away: the spool keeps them
                self._w.failed(self.name, exc)
            else:
                self._w.store_back()
                self._heard(self._landed, batch, "landed")
                return
        if spool is not None and self.spool_now(batch):
            return
        await self._w.until_done(functools.partial(self._write, batch), self.name)
        self._heard(self._landed, batch, "landed")

    def spool_now(self, batch: list[T]) -> bool:
        """Durably spool ``batch``; False (alarm logged once, metric set) without a spool or when it is full."""
        spool = self.spool
        if spool is None:
            return False
        was_full = spool.full
        try:
            appended = spool.append(batch)
        except OSError:  # a disk that fails: the entries stay in memory, as with a full spool
            self._w.unexpected(self.name)
            log.exception("%s spool: appending %d entries failed; they wait in memory", self.name, len(batch))
            return False
        if appended:
            self.drained.clear()
            self._spooled.set()
            self._w.spool_metrics()
            return True
        if not was_full:
            log.error("%s spool is full (%d bytes): entries now wait in memory", self.name, spool.size_bytes())
        self._w.spool_metrics()
        return False

    def spool_rest(self) -> int:
        """At shutdown: spool what is still in memory; return how many entries could not be (lost)."""
        left = self.writing + [self.queue.get_nowait() for _ in range(self.queue.qsize())]
        if left and self.spool_now(left):
            log.warning("%d %s entries spooled at shutdown, replayed at the next start", len(left), self.name)
            return 0
        return len(left)

    async def _replay(self, spool: JsonlSpool[T]) -> None:
        """Put spooled entries into the store, oldest first, as soon as it takes them; an error of the spool's own
        (its files) is logged and the replay tried again after a back-off."""
        while True:
            try:
                await self._replay_all(spool)
            except asyncio.CancelledError:
                raise
            except Exception:
                self._w.unexpected(f"{self.name}-spool")
                log.exception("%s spool replay: unexpected error; tried again in %.1f s", self.name, self._w.retry_s)
                await self._w.clock.sleep(self._w.retry_s)

    async def _replay_all(self, spool: JsonlSpool[T]) -> None:
        delay = self._w.retry_s
        while True:
            if not spool.has_pending():
                self._spooled.clear()
                self.drained.set()
                self._w.spool_metrics()
                await self._spooled.wait()
                continue
            batch, end = spool.pending(MAX_BATCH)
            try:
                await self._write(batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # still away: try again later, the entries stay spooled
                self._w.failed(f"{self.name}-spool", exc)
                await self._w.clock.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            spool.commit(end)
            self._w.store_back()
            self._heard(self._landed, batch, "landed")
            delay = self._w.retry_s


def _ignore(_: Sequence[object]) -> None:
    return None


def _corrects_a_window(settlement: Settlement) -> bool:
    """A settlement the client's next request may need landed at once: a window correction (TPM refund)."""
    return bool(settlement.windows)


class LedgerWriter:
    """Writes usage records to the ledger and settlements (TPM corrections, slot releases) to the limits, in the
    background, so no response waits on the store. Entries queued back to back go together: one
    ``append_usage_many`` round trip per tenant, one pipelined ``settle_many``; each lane lingers (``ledger_linger_s``,
    ``settle_linger_s``) so that entries arriving one at a time go together too, and the settlements drop the slot
    releases that the tenant's next admits have carried meanwhile (``unsettled``: ``Admitter.unsettled``).

    With spools (``spool`` for records, ``settle_spool`` for settlements), what the store cannot take is appended
    to them (durable on disk) and replayed in order, once each, by a replay task when the store is back; a new
    entry waits behind spooled ones, so the store sees them in order. Without one (or when it is full: the alarm is
    logged and the metric set), they are retried in memory. ``usage_landed`` and ``settle_landed`` hear what the
    store has taken (the admitter's local accounting). ``close`` drains what is queued and spools what is still in
    memory. With a ``journal`` (``gateway.usage.spool.Journal``) each record is on disk from ``write`` until the
    store or the spool has it, so a kill after the client saw the answer's end loses none (the next process on the
    directory writes them; settlements are not journaled: a lost slot release expires with its TTL, a lost TPM
    refund leaves its window counted high).

    Every write to a shared store has a deadline, ``store_timeout_s`` seconds (``GatewaySettings.store_timeout_s``,
    as admission's): past it the write counts as failed, and the batch is spooled or retried like any other; an
    in-process store (``MemoryStore``) has none."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock,
        metrics: GatewayMetrics,
        spool: Spool | None = None,
        settle_spool: SettlementSpool | None = None,
        retry_s: float = 0.5,
        usage_landed: Callable[[Sequence[UsageRecord]], None] = _ignore,
        settle_landed: Callable[[Sequence[Settlement]], None] = _ignore,
        ledger_linger_s: float = 0.0,
        settle_linger_s: float = 0.0,
        unsettled: Callable[[list[Settlement]], list[Settlement]] | None = None,
        journal: Journal | None = None,
        store_timeout_s: float = 2.0,
    ) -> None:
        self.clock = clock
        self.retry_s = retry_s
        self._metrics = metrics

        async def settle_many(batch: list[Settlement]) -> None:
            await store.settle_many(batch, now=clock.wall())

        append_usage: Callable[[list[UsageRecord]], Awaitable[None]] = store.append_usage_many
        settle: Callable[[list[Settlement]], Awaitable[None]] = settle_many
        if not in_process(store):  # an in-process store's write is a call that cannot hang: no deadline
            append_usage, settle = _within(append_usage, store_timeout_s), _within(settle, store_timeout_s)
        self._journal = journal
        self._records: _Lane[UsageRecord] = _Lane(
            "ledger", self, write=append_usage, spool=spool, landed=usage_landed, linger_s=ledger_linger_s,
            durable=None if journal is None else journal.done,
        )  # fmt: skip
        if journal is not None:  # what a killed process journaled and did not see stored, ahead of any new record
            for record in journal.recovered():
                self._records.put(record)
        self._settles: _Lane[Settlement] = _Lane(
            "settle", self, write=settle, spool=settle_spool, landed=settle_landed, linger_s=settle_linger_s,
            prepare=unsettled, urgent=_corrects_a_window,
        )  # fmt: skip
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    def from_settings(
        cls, store: Store, *, clock: Clock, metrics: GatewayMetrics, settings: GatewaySettings, admitter: Admitter
    ) -> LedgerWriter:
        """The writer of ``settings``: spooled under ``spool_path`` when set; ``admitter`` hears what landed. The
        lanes linger only on a shared store: in process (``fleet.store.memory.in_process``), a write is a function
        call and sharing one saves nothing."""
        spool_dir, limit = settings.spool_path(), settings.spool_max_bytes
        remote = not in_process(store)
        return cls(
            store, clock=clock, metrics=metrics,
            spool=Spool(spool_dir, max_bytes=limit) if spool_dir else None,
            settle_spool=SettlementSpool(spool_dir, max_bytes=limit) if spool_dir else None,
            journal=Journal(spool_dir, fsync=settings.ledger_journal_fsync) if spool_dir else None,
            usage_landed=admitter.usage_landed, settle_landed=admitter.settle_landed,
            ledger_linger_s=settings.ledger_linger_s if remote else 0.0,
            settle_linger_s=settings.settle_linger_s if remote else 0.0,
            unsettled=admitter.unsettled, store_timeout_s=settings.store_timeout_s,
        )  # fmt: skip

    def start(self) -> None:
        self._tasks = self._records.tasks() + self._settles.tasks()

    def append(self, record: UsageRecord) -> None:
        if self._journal is not None:
            self._journal.append(record)
        self._records.put(record)
        self.backlog()

    def settle(self, settlement: Settlement) -> None:
        self._settles.put(settlement)
        self.backlog()

    def write(self, record: UsageRecord, settlement: Settlement | None) -> None:
        """A finished call's record, then the settlement of its admission (None: nothing left to settle). With a
        journal the record is on disk when this returns (``Journal``): call it before the answer's end is sent."""
        if self._journal is not None:
            self._journal.append(record)
        self._records.put(record)
        if settlement is not None:
            self._settles.put(settlement)
        self.backlog()

    async def idle(self) -> None:
        """Wait until every queued record and settlement is in the store or a spool."""
        await self._records.queue.join()
        await self._settles.queue.join()

    def spool_detail(self) -> dict[str, int]:
        """``spool_bytes`` (usage and settlements waiting in the spools) when there are spools, else nothing."""
        spools = self._spools()
        return {"spool_bytes": sum(s.size_bytes() for s in spools)} if spools else {}

    def _spools(self) -> list[JsonlSpool[UsageRecord] | JsonlSpool[Settlement]]:
        return [s for s in (self._records.spool, self._settles.spool) if s is not None]

    # shared by the lanes ---------------------------------------------------------------------------------
    def backlog(self) -> None:
        self._metrics.ledger_backlog.set(self._records.queue.qsize() + self._settles.queue.qsize())

    def spool_metrics(self) -> None:
        spools = self._spools()
        self._metrics.spool_bytes.set(sum(s.size_bytes() for s in spools if s.has_pending()))
        self._metrics.spool_full.set(1 if any(s.full for s in spools) else 0)

    def store_back(self) -> None:
        self._metrics.store_up.set(1)

    async def until_done(self, job: Callable[[], Awaitable[None]], loop: str) -> None:
        delay = self.retry_s
        while True:
            try:
                await job()
                self.store_back()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store may be briefly away: keep the write and retry
                self.failed(loop, exc)
                log.warning("%s write failed, retrying in %.1f s: %s", loop, delay, exc)
                await self.clock.sleep(delay)
                delay = min(delay * 2, 10.0)

    def unexpected(self, loop: str) -> None:
        """A lane's own step failed (a defect, not the store): counted like a failed write of that loop."""
        self._metrics.loop_errors.labels(loop=loop).inc()

    def failed(self, loop: str, exc: Exception) -> None:
        self._metrics.loop_errors.labels(loop=loop).inc()
        self._metrics.store_up.set(0)
        log.debug("store write failed: %s", exc)

    # shutdown --------------------------------------------------------------------------------------------
    async def close(self, *, drain_s: float = 5.0) -> None:
        """Drain the queues and the spools (when the store takes them) for up to ``drain_s`` seconds, then stop.
        Entries still in memory go to the spools (when there are, with room); anything left after that is logged
        as lost. What stays spooled is replayed by the next process on the same spool directory."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain_s):
                await self.idle()
                for lane in (self._records, self._settles):  # replayed while the store takes them
                    await lane.drained.wait()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        lost_records = self._records.spool_rest()
        lost = lost_records + self._settles.spool_rest()
        if self._journal is not None:
            if not lost_records:  # the store or the spool has every record: the next process replays none
                self._journal.clear()
            self._journal.close()
        for spool in self._spools():
            spool.close()
        if lost:
            log.error("%d usage/settle writes could not be stored before shutdown", lost)
