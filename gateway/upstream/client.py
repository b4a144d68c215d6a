"""The upstream call: one pooled aiohttp session, retries on another worker before the first byte.

A worker counts as having answered once the first byte of a successful (< 500) response body arrives.
Before that, a connect error, a 5xx status, an empty body or the first-byte timeout is a failure: the
worker is charged with it (see ``WorkerPool.failed``) and the next-ranked worker is tried, at most
``max_retries`` times. After it, the response is committed to the client and never retried.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from types import TracebackType

import aiohttp
from prometheus_client import Gauge

from gateway.errors import GatewayError, NoWorkerAvailable, UpstreamFailed, UpstreamTimeout
from gateway.routing.pool import WorkerPool, WorkerView
from gateway.settings import GatewaySettings
from gateway.upstream.deadline import Deadline
from gateway.usage.metrics import GatewayMetrics

_JSON = {"content-type": "application/json"}
_ERROR_BODY_LIMIT = 64 * 1024
_LARGE_BODY = 1024 * 1024


class Hold:
    """One request's hold on a worker: ``async with hold: …``. Created when a worker is tried; it counts the
    request in the worker's ``in_flight`` (and the in-flight gauge) and its estimated prompt tokens as prefill
    outstanding there until the first byte. Its exit — ``close`` — is the call's one cleanup: it closes the
    response (a stream still open is aborted, so the worker stops generating), releases the counts and reports
    the call's outcome to the pool: ``failure`` charges the worker, ``ok`` clears its failures. A call that ends
    with neither (cancelled, or a worker's own 4xx answer) reports nothing."""

    __slots__ = ("_gauge", "_pool", "_prefill", "attempts", "deadline", "failure", "first_chunk", "ok", "refused",
                 "request_id", "response", "worker")  # fmt: skip

    response: aiohttp.ClientResponse
    """Set once the worker answered with a status (always set on a hold that ``Upstream.open`` returns)."""

    def __init__(
        self,
        worker: WorkerView,
        *,
        prompt_tokens: int,
        attempts: int,
        pool: WorkerPool,
        gauge: Gauge,
        request_id: str = "",
        deadline: Deadline | None = None,
    ) -> None:
        self.worker = worker
        self.request_id = request_id
        """The gateway's id of the request (named in the client's error messages)."""
        self.attempts = attempts
        """Workers tried for this call, this one included."""
        self.first_chunk = b""
        self.ok = False
        """The worker answered well: reported when the hold ends."""
        self.failure: GatewayError | None = None
        """What the worker is charged with when the hold ends."""
        self.refused = False
        """The worker refused the connection (it is marked down at once)."""
        self.deadline = Deadline() if deadline is None else deadline
        """The call's waits on this worker (first byte, the answer, each chunk): one timer for them all, and for
        the call's admission when it is the call's (``gateway.pipeline``)."""
        self._pool = pool
        self._gauge = gauge
        self._prefill = max(0, prompt_tokens)
        worker.in_flight += 1
        worker.prefill_tokens += self._prefill
        gauge.inc()

    def answered(self, first_chunk: bytes) -> None:
        """The worker's first body byte arrived: its prefill is done."""
        self.first_chunk = first_chunk
        self._end_prefill()

    async def close(self) -> None:
        """Release everything the hold counts and report its outcome; call exactly once."""
        self._end_prefill()
        self.deadline.close()
        if hasattr(self, "response"):  # unset when the worker never answered
            self.response.close()
        self.worker.in_flight -= 1
        self._gauge.dec()
        if self.failure is not None:
            reason = self.failure.detail or self.failure.message
            await self._pool.failed(self.worker, reason=reason, refused=self.refused)
        elif self.ok:
            self._pool.succeeded(self.worker)

    def _end_prefill(self) -> None:
        if self._prefill:
            self.worker.prefill_tokens = max(0, self.worker.prefill_tokens - self._prefill)
            self._prefill = 0
            self._pool.prefill_done(self.worker)

    async def __aenter__(self) -> Hold:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class _Attempt(Exception):
    """One worker failed before its first byte."""

    def __init__(self, cause: str, error: GatewayError, *, refused: bool = False) -> None:
        super().__init__(cause)
        self.cause = cause
        self.error = error
        self.refused = refused


def new_session(settings: GatewaySettings) -> aiohttp.ClientSession:
    """The pooled upstream session (built in the app's lifespan)."""
    connector = aiohttp.TCPConnector(
        limit=settings.upstream_pool_size, limit_per_host=0, ttl_dns_cache=300,
        keepalive_timeout=settings.upstream_keep_alive_s,
    )  # fmt: skip
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)


class Upstream:
    """Sends a request to the best worker that answers, retrying before the first byte."""

    def __init__(
        self, session: aiohttp.ClientSession, *, pool: WorkerPool, settings: GatewaySettings, metrics: GatewayMetrics
    ) -> None:
        self._session = session
        self._pool = pool
        self._settings = settings
        self._metrics = metrics
        self._connect = aiohttp.ClientTimeout(total=None, sock_connect=settings.connect_timeout_s)
        key = settings.upstream_api_key
        self._headers = {**_JSON, "authorization": f"Bearer {key.get_secret_value()}"} if key else _JSON
        self._retry_after = {"retry-after": str(max(1, math.ceil(settings.no_worker_retry_after_s)))}
        self._gauges = {view.id: metrics.in_flight.labels(worker=view.id) for view in pool.views.values()}

    async def open(
        self,
        ranked: Sequence[WorkerView],
        path: str,
        body: bytes,
        *,
        stream: bool,
        request_id: str,
        prompt_tokens: int = 0,
        deadline: Deadline | None = None,
    ) -> Hold:
        """A hold on the first of the ``1 + max_retries`` best workers that answers, or the last failure.

        While a worker has not answered its first byte, ``prompt_tokens`` (the gateway's estimate) count as prefill
        work outstanding there, which the queue scorer weighs (a long prompt holds a worker's step budget)."""
        last: _Attempt | None = None
        budget = 1 + self._settings.max_retries
        for attempt, view in enumerate(ranked[:budget], start=1):
            if last is not None:
                self._metrics.upstream_retries.labels(worker=view.id, cause=last.cause).inc()
            hold = Hold(
                view, prompt_tokens=prompt_tokens, attempts=attempt, pool=self._pool, gauge=self._gauges[view.id],
                request_id=request_id, deadline=deadline,
            )  # fmt: skip
            try:
                await self._attempt(hold, path, body, stream=stream)
            except _Attempt as failure:
                last = failure
                hold.failure, hold.refused = failure.error, failure.refused
                await hold.close()
                continue
            except BaseException:  # cancelled (the client left): nothing to report
                await hold.close()
                raise
            return hold
        if last is None:
            raise NoWorkerAvailable(f"No worker is available; request id {request_id}.", headers=self._retry_after)
        raise last.error

    async def _attempt(self, hold: Hold, path: str, body: bytes, *, stream: bool) -> None:
        """Send the request to the hold's worker and wait for its first byte; ``_Attempt`` when it fails first."""
        view = hold.worker
        limit = self._settings.first_byte_timeout_s if stream else self._settings.request_timeout_s
        try:
            with hold.deadline.after(limit):
                # aiohttp writes a large bytes body in one go (and warns): stream it from a buffer instead.
                data = body if len(body) <= _LARGE_BODY else io.BytesIO(body)
                response = hold.response = await self._session.post(
                    view.config.url + path, data=data, headers=self._headers, timeout=self._connect
                )
                if response.status >= 500:
                    text = (await response.content.read(_ERROR_BODY_LIMIT)).decode(errors="replace")
                    detail = f"worker {view.id} answered {response.status}: {text[:500]}"
                    raise _Attempt(f"http_{response.status}", UpstreamFailed(detail, request_id=hold.request_id))
                first = await response.content.readany()
                if not first:
                    detail = f"worker {view.id} closed the response before any data"
                    raise _Attempt("empty", UpstreamFailed(detail, request_id=hold.request_id))
                hold.answered(first)
        except BaseException as exc:  # cancellation included (the hold closes the response)
            raise _classify(hold, exc, limit) from None


def _classify(hold: Hold, exc: BaseException, limit_s: float) -> BaseException:
    """The ``_Attempt`` a failure before the first byte counts as; other exceptions pass unchanged."""
    worker, request_id = hold.worker.id, hold.request_id
    if isinstance(exc, TimeoutError):
        summary = f"The upstream worker did not answer within {limit_s:g} s"
        timeout = UpstreamTimeout(f"worker {worker} timed out", request_id=request_id, summary=summary)
        return _Attempt("timeout", timeout)
    if isinstance(exc, aiohttp.ClientConnectorError):
        message = f"No worker could be reached; request id {request_id}."
        refused = NoWorkerAvailable(message, detail=f"cannot connect to worker {worker}: {exc.os_error}")
        return _Attempt("connect", refused, refused=True)
    if isinstance(exc, aiohttp.ClientError | OSError):
        detail = f"worker {worker} failed before answering: {exc!r}"
        return _Attempt("disconnect", UpstreamFailed(detail, request_id=request_id))
    return exc
