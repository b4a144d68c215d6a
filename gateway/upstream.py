"""The upstream call: one pooled aiohttp session, retries on another worker before the first byte.

A worker counts as having answered once the first byte of a successful (< 500) response body arrives.
Before that, a connect error, a 5xx status, an empty body or the first-byte timeout is a failure: the
worker is charged with it (see ``WorkerPool.failed``) and the next-ranked worker is tried, at most
``max_retries`` times. After it, the response is committed to the client and never retried.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from gateway.errors import GatewayError, NoWorkerAvailable, UpstreamFailed, UpstreamTimeout
from gateway.metrics import GatewayMetrics
from gateway.pool import WorkerPool, WorkerView
from gateway.settings import GatewaySettings

_JSON = {"content-type": "application/json"}
_ERROR_BODY_LIMIT = 64 * 1024
_LARGE_BODY = 1024 * 1024


@dataclass(slots=True)
class Opened:
    """A committed upstream response: the worker, the response and its first body chunk."""

    worker: WorkerView
    response: aiohttp.ClientResponse
    first_chunk: bytes
    attempts: int

    def release(self) -> None:
        """Close the response: a stream still open is aborted, so the worker stops generating."""
        self.response.close()


class _Attempt(Exception):
    """One worker failed before its first byte."""

    def __init__(self, cause: str, error: GatewayError, *, refused: bool = False) -> None:
        super().__init__(cause)
        self.cause = cause
        self.error = error
        self.refused = refused


def new_session(settings: GatewaySettings) -> aiohttp.ClientSession:
    """The pooled upstream session (built in the app's lifespan)."""
    connector = aiohttp.TCPConnector(limit=settings.upstream_pool_size, limit_per_host=0, ttl_dns_cache=300)
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

    async def open(
        self, ranked: Sequence[WorkerView], path: str, body: bytes, *, stream: bool, prompt_tokens: int = 0
    ) -> Opened:
        """The first committed response among the ``1 + max_retries`` best workers, or the last failure.

        While a worker has not answered its first byte, ``prompt_tokens`` (the gateway's estimate) count as prefill
        work outstanding there, which the queue scorer weighs (a long prompt holds a worker's step budget)."""
        last: _Attempt | None = None
        budget = 1 + self._settings.max_retries
        for attempt, view in enumerate(ranked[:budget], start=1):
            if last is not None:
                self._metrics.upstream_retries.labels(worker=view.id, cause=last.cause).inc()
            view.in_flight += 1
            view.begin_prefill(prompt_tokens)
            try:
                response, first = await self._attempt(view, path, body, stream=stream)
            except _Attempt as failure:
                view.in_flight -= 1
                last = failure
                await self._pool.failed(view, reason=failure.cause, refused=failure.refused)
                continue
            except BaseException:
                view.in_flight -= 1
                raise
            finally:
                view.end_prefill(prompt_tokens)
            self._metrics.child(self._metrics.in_flight, view.id).inc()
            return Opened(worker=view, response=response, first_chunk=first, attempts=attempt)
        if last is None:
            raise NoWorkerAvailable("No worker is available.")
        raise last.error

    def done(self, opened: Opened) -> None:
        """Account the end of a committed request (always call once)."""
        opened.release()
        opened.worker.in_flight -= 1
        self._metrics.child(self._metrics.in_flight, opened.worker.id).dec()

    async def _attempt(
        self, view: WorkerView, path: str, body: bytes, *, stream: bool
    ) -> tuple[aiohttp.ClientResponse, bytes]:
        limit = self._settings.first_byte_timeout_s if stream else self._settings.request_timeout_s
        response: aiohttp.ClientResponse | None = None
        try:
            async with asyncio.timeout(limit):
                # aiohttp writes a large bytes body in one go (and warns): stream it from a buffer instead.
                data = body if len(body) <= _LARGE_BODY else io.BytesIO(body)
                response = await self._session.post(
                    view.config.url + path, data=data, headers=_JSON, timeout=self._connect
                )
                if response.status >= 500:
                    text = (await response.content.read(_ERROR_BODY_LIMIT)).decode(errors="replace")
                    raise _Attempt(
                        f"http_{response.status}",
                        UpstreamFailed(f"Worker {view.id} answered {response.status}: {text[:500]}"),
                    )
                first = await response.content.readany()
                if not first:
                    raise _Attempt("empty", UpstreamFailed(f"Worker {view.id} closed the response before any data."))
                return response, first
        except BaseException as exc:  # cancellation included: never leave a response open
            if response is not None:
                response.close()
            raise _classify(view, exc, limit) from None


def _classify(view: WorkerView, exc: BaseException, limit_s: float) -> BaseException:
    """The ``_Attempt`` a failure before the first byte counts as; other exceptions pass unchanged."""
    if isinstance(exc, TimeoutError):
        return _Attempt("timeout", UpstreamTimeout(f"Worker {view.id} did not answer within {limit_s} s."))
    if isinstance(exc, aiohttp.ClientConnectorError):
        error = NoWorkerAvailable(f"Cannot connect to worker {view.id}: {exc.os_error}")
        return _Attempt("connect", error, refused=True)
    if isinstance(exc, aiohttp.ClientError | OSError):
        return _Attempt("disconnect", UpstreamFailed(f"Worker {view.id} failed before answering: {exc!r}"))
    return exc
