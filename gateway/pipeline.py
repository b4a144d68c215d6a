"""The request pipeline (DESIGN §6): parse → authorise the model → admit → route → forward → stream or
read → meter → telemetry. ``complete`` is the whole pipeline in one function; each step is a method of
``Call``, the state of one request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import orjson
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.responses import Response
from starlette.types import Receive

from fleet.store.protocol import UsageRecord
from gateway import tracing as attr
from gateway.admission import Ticket
from gateway.auth import Principal
from gateway.body import CompletionRequest, parse_completion
from gateway.core import Gateway
from gateway.disconnect import DisconnectGuard
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    ModelNotAllowed,
    ModelNotFound,
    NoWorkerAvailable,
    RateLimited,
    UpstreamFailed,
    UpstreamTimeout,
    sse_error_event,
)
from gateway.metering import request_cost
from gateway.pool import WorkerView
from gateway.routing import RouteContext
from gateway.sse import DONE, StreamMeter, Usage, usage_of
from gateway.streaming import RelayResponse
from gateway.upstream import Opened


@dataclass(frozen=True, slots=True)
class Endpoint:
    path: str
    """Path on the worker."""
    prompt_field: str
    operation: str
    """GenAI ``gen_ai.operation.name``."""


CHAT = Endpoint("/v1/chat/completions", "messages", "chat")
TEXT = Endpoint("/v1/completions", "prompt", "text_completion")


async def complete(
    gw: Gateway,
    principal: Principal,
    raw: bytes,
    *,
    endpoint: Endpoint,
    request_id: str,
    started: float,
    receive: Receive | None = None,
) -> Response:
    """Serve one completion request; ``started`` is the clock's monotonic time when it arrived and ``receive``
    the ASGI channel that tells when the client disconnects (the body has been read already)."""
    settings = gw.settings
    req = parse_completion(
        raw, prompt_field=endpoint.prompt_field, max_messages=settings.max_messages, max_n=settings.max_n
    )
    authorise(gw, principal, req)  # 404 / 403 / 400
    call = Call(gw, principal, req, endpoint, request_id, started)
    with DisconnectGuard(receive):
        try:
            call.ticket = await call.admit()  # 429 with the limit that tripped
            ranked = await call.route()  # 503 when no worker qualifies
            call.opened = await call.forward(ranked)  # retried before the first byte; 502 / 503 / 504
        except BaseException as exc:
            await call.abandon(exc)
            raise
        if req.stream and call.opened.response.status == 200:
            return RelayResponse(call.relay(), on_unfinished=call.abandon_stream)
        return await call.read_whole()


def authorise(gw: Gateway, principal: Principal, req: CompletionRequest) -> None:
    """404 for a model no worker serves, 403 for one the tenant may not use, 400 for a ``max_tokens`` beyond the
    model's context window (it would also reserve an absurd number of tokens)."""
    model = gw.fleet.model(req.model)
    if model is None:
        raise ModelNotFound(f"The model '{req.model}' does not exist.", param="model")
    if not principal.tenant.allows(req.model):
        message = f"Tenant '{principal.tenant.id}' may not use the model '{req.model}'."
        raise ModelNotAllowed(message, param="model")
    if req.max_tokens is not None and req.max_tokens > model.context_window:
        message = f"'max_tokens' is {req.max_tokens}; the model's context window is {model.context_window} tokens."
        raise InvalidRequest(message, param="max_tokens")


class Call:
    """One request on its way through the pipeline."""

    ticket: Ticket | None = None
    opened: Opened

    def __init__(
        self,
        gw: Gateway,
        principal: Principal,
        req: CompletionRequest,
        endpoint: Endpoint,
        request_id: str,
        started: float,
    ) -> None:
        self.gw, self.principal, self.req, self.endpoint = gw, principal, req, endpoint
        self.request_id, self.started = request_id, started
        self.forwarded_at = started
        self.finished = False
        self.span = gw.tracer.start_span(
            f"{endpoint.operation} {req.model}",
            kind=SpanKind.SERVER,
            attributes={
                attr.OPERATION: endpoint.operation,
                attr.REQUEST_MODEL: req.model,
                attr.TENANT: principal.tenant.id,
                attr.TIER: principal.tier_name,
                attr.REQUEST_ID: request_id,
                **({attr.REQUEST_MAX_TOKENS: req.max_tokens} if req.max_tokens else {}),
            },
        )
        self.ctx = trace.set_span_in_context(self.span)

    # ------------------------------------------------------------------------------------------ steps
    async def admit(self) -> Ticket:
        gw, tenant = self.gw, self.principal.tenant
        tokens = self.req.estimated_tokens(
            default_max_tokens=gw.settings.default_max_tokens,
            chars_per_token=gw.settings.chars_per_token,
            tokens_per_message=gw.settings.tokens_per_message,
        )
        with gw.tracer.start_as_current_span("gearshift.admission", context=self.ctx) as span:
            span.set_attribute("gearshift.reserved_tokens", tokens)
            try:
                return await gw.admitter.admit(tenant, request_id=self.request_id, tokens=tokens)
            except RateLimited as exc:
                gw.metrics.admission_rejections.labels(tenant=tenant.id, reason=exc.limit).inc()
                span.set_attribute("gearshift.limit", exc.limit)
                raise

    async def route(self) -> list[WorkerView]:
        gw = self.gw
        with gw.tracer.start_as_current_span("gearshift.routing", context=self.ctx) as span:
            ctx = RouteContext(model=self.req.model, tier=self.principal.tier, now=gw.clock.wall())
            decision = await gw.router.route(ctx, list(gw.pool.views.values()))
            if not decision.ranked:
                raise NoWorkerAvailable(
                    f"No healthy worker serves '{self.req.model}' (excluded: {decision.filtered_out}).",
                    param="model",
                )
            span.set_attribute("gearshift.route.ranked", [w.id for w in decision.ranked])
            span.set_attribute("gearshift.route.scores", [round(decision.scores[w.id], 4) for w in decision.ranked])
            return decision.ranked

    async def forward(self, ranked: list[WorkerView]) -> Opened:
        gw = self.gw
        priority = self.principal.tier.priority if gw.settings.send_priority else None
        body = self.req.upstream_body(priority=priority)
        with gw.tracer.start_as_current_span(
            f"{self.endpoint.operation} {self.req.model}", context=self.ctx, kind=SpanKind.CLIENT
        ) as span:
            self.forwarded_at = gw.clock.monotonic()
            prompt_tokens = self.req.estimated_prompt_tokens(
                chars_per_token=gw.settings.chars_per_token, tokens_per_message=gw.settings.tokens_per_message
            )
            opened = await gw.upstream.open(
                ranked, self.endpoint.path, body, stream=self.req.stream, prompt_tokens=prompt_tokens
            )
            span.set_attribute(attr.WORKER, opened.worker.id)
            span.set_attribute(attr.SERVER_ADDRESS, opened.worker.config.url)
            span.set_attribute("gearshift.attempts", opened.attempts)
            span.set_attribute("http.response.status_code", opened.response.status)
        self.span.set_attribute(attr.WORKER, opened.worker.id)
        return opened

    async def read_whole(self) -> Response:
        """Non-streaming (or a worker's error answer): read the rest of the body and pass it on."""
        gw, opened = self.gw, self.opened
        try:
            async with asyncio.timeout(gw.settings.request_timeout_s):
                body = opened.first_chunk + await opened.response.read()
        except asyncio.CancelledError:
            self.meter_in_background("cancelled", None)
            raise
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            error = UpstreamFailed(f"Worker {opened.worker.id} failed while answering: {exc!r}")
            await self.meter("error", None, error=error)
            raise error from None
        status = opened.response.status
        usage = None
        if status == 200:
            try:
                usage = usage_of(orjson.loads(body))
            except orjson.JSONDecodeError:
                error = UpstreamFailed(f"Worker {opened.worker.id} answered with a body that is not JSON.")
                await self.meter("error", None, error=error)
                raise error from None
        await self.meter("ok" if status < 400 else "error", usage)
        return Response(body, status_code=status, media_type="application/json")

    async def relay(self) -> AsyncIterator[bytes]:
        """Pass the worker's events through as they complete; end with ``[DONE]`` or an error event."""
        gw, opened = self.gw, self.opened
        clock, idle = gw.clock, gw.settings.idle_timeout_s
        meter = StreamMeter(strip_usage=not self.req.client_wants_usage)
        content = opened.response.content
        chunk: bytes = opened.first_chunk
        error: GatewayError | None = None
        try:
            while True:
                out = meter.feed(chunk, clock.monotonic())
                if out:
                    yield out
                if meter.done:
                    break
                try:
                    async with asyncio.timeout(idle):
                        chunk = await content.readany()
                except TimeoutError:
                    error = UpstreamTimeout(f"Worker {opened.worker.id} sent nothing for {idle} s.")
                    break
                except (aiohttp.ClientError, OSError) as exc:
                    error = UpstreamFailed(f"Worker {opened.worker.id} failed mid-stream: {exc!r}")
                    break
                if not chunk:
                    error = UpstreamFailed(f"Worker {opened.worker.id} ended the stream without [DONE].")
                    break
            if error is not None:
                gw.metrics.errors.labels(type=error.type, status="mid-stream").inc()
            await self.meter("ok" if error is None else "error", meter.usage, stream=meter, error=error)
            yield (DONE + b"\n\n") if error is None else sse_error_event(error)
        finally:
            if not self.finished:  # the client went away: account without waiting, and stop the worker
                self.meter_in_background("cancelled", meter.usage, stream=meter)

    # ---------------------------------------------------------------------------------------- metering
    async def meter(
        self, status: str, usage: Usage | None, *, stream: StreamMeter | None = None, error: GatewayError | None = None
    ) -> None:
        """Meter the finished request; the settlement is awaited so a caller's next request sees it."""
        settle = self._account(status, usage, stream=stream, error=error)
        if error is not None:
            await self.gw.pool.failed(self.opened.worker, reason=error.message)
        try:
            await settle()
        except Exception:  # store briefly away: the ledger writer retries it
            self.gw.ledger.submit(settle)

    def abandon_stream(self) -> None:
        """The stream response ended; if its body never finished metering (it may never have started), do it."""
        if not self.finished:
            self.meter_in_background("cancelled", None)

    def meter_in_background(self, status: str, usage: Usage | None, *, stream: StreamMeter | None = None) -> None:
        self.gw.ledger.submit(self._account(status, usage, stream=stream, error=None))

    def _account(
        self, status: str, usage: Usage | None, *, stream: StreamMeter | None, error: GatewayError | None
    ) -> Callable[[], Awaitable[None]]:
        """Record usage, cost, metrics and the span; release the worker; return the settle job."""
        self.finished = True
        gw, opened, req = self.gw, self.opened, self.req
        now = gw.clock.monotonic()
        prompt = usage.prompt_tokens if usage else 0
        completion = usage.completion_tokens if usage else (stream.token_events if stream else 0)
        ttft = tpot = None
        if stream is not None and stream.first_token_at is not None:
            ttft = stream.first_token_at - self.started
            if completion > 1 and stream.last_token_at is not None:
                tpot = (stream.last_token_at - stream.first_token_at) / (completion - 1)
        cost = request_cost(
            opened.worker,
            completion_tokens=completion,
            busy_s=now - self.forwarded_at,
            concurrent=opened.worker.in_flight,
        )
        gw.upstream.done(opened)
        record = UsageRecord(
            request_id=self.request_id,
            tenant=self.principal.tenant.id,
            model=req.model,
            worker_id=opened.worker.id,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cost_usd=cost,
            status=status,
            ttft_s=ttft,
            tpot_s=tpot,
            at=gw.clock.wall(),
        )
        gw.ledger.append(record)
        if status == "ok":
            gw.pool.succeeded(opened.worker)
        self._observe(record, now - self.started, error)
        ticket = self.ticket
        assert ticket is not None

        async def settle() -> None:
            await gw.admitter.settle(ticket, used_tokens=prompt + completion, cost_usd=cost)

        return settle

    def _observe(self, record: UsageRecord, duration_s: float, error: GatewayError | None) -> None:
        self.gw.metrics.finished(
            tenant=record.tenant,
            model=record.model,
            worker=record.worker_id or "",
            status=record.status,
            tier=self.principal.tier_name,
            prompt_tokens=record.prompt_tokens,
            completion_tokens=record.completion_tokens,
            cost_usd=record.cost_usd,
            duration_s=duration_s,
            ttft_s=record.ttft_s,
            tpot_s=record.tpot_s,
        )
        if error is not None:
            self.span.set_attribute(attr.ERROR_TYPE, type(error).__name__)
            self.span.set_status(Status(StatusCode.ERROR, error.message))
        self.span.set_attribute(attr.USAGE_INPUT, record.prompt_tokens)
        self.span.set_attribute(attr.USAGE_OUTPUT, record.completion_tokens)
        self.span.set_attribute("gearshift.cost_usd", record.cost_usd)
        self.span.end()

    async def abandon(self, exc: BaseException) -> None:
        """The request failed before a worker answered: release what admission reserved, end the span."""
        if isinstance(exc, GatewayError):
            self.span.set_attribute(attr.ERROR_TYPE, type(exc).__name__)
            self.span.set_status(Status(StatusCode.ERROR, exc.message))
        self.span.end()
        if self.ticket is not None:
            ticket = self.ticket

            async def release() -> None:
                await self.gw.admitter.settle(ticket, used_tokens=0, cost_usd=0.0)

            try:
                await asyncio.shield(release())
            except Exception:
                self.gw.ledger.submit(release)
