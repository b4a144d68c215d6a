"""The request pipeline (DESIGN §6): parse → authorise the model → admit → route → queue → forward → relay → meter.
``complete`` is the whole pipeline in one function; each step is a method of ``Call``, the state of one
request, which calls the stage that does the work (``gateway.intake``, ``gateway.routing``, ``gateway.upstream``,
``gateway.usage``) and keeps the request's span. The API shape (``gateway.upstream.endpoints.Endpoint``) brings
its own parser, stream meter and end event: nothing here branches on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from starlette.responses import Response
from starlette.types import Receive, Send

from fleet.plan import traffic_class
from gateway import errors
from gateway.intake.admission import Ticket
from gateway.intake.auth import Principal
from gateway.intake.hints import RequestHints
from gateway.routing.context import RouteContext
from gateway.routing.pool import WorkerView
from gateway.routing.prefix import request_blocks
from gateway.upstream import relay
from gateway.upstream.body import CompletionRequest
from gateway.upstream.client import Hold
from gateway.upstream.deadline import Deadline
from gateway.upstream.endpoints import Endpoint
from gateway.upstream.sse import StreamMeter, Usage
from gateway.usage import tracing as attr
from gateway.usage.metering import usage_record
from gateway.wiring import Gateway

_NO_SPAN: AbstractContextManager[Span] = contextlib.nullcontext(trace.INVALID_SPAN)


async def complete(
    gw: Gateway,
    principal: Principal,
    raw: bytes,
    *,
    endpoint: Endpoint,
    request_id: str,
    started: float,
    receive: Receive | None,
    send: Send,
    headers: Sequence[tuple[bytes, bytes]] = (),
    request_headers: Iterable[tuple[bytes, bytes]] = (),
) -> Response | None:
    """Serve one completion request whose body ``raw`` has been read (``request_headers``: the request's, for its
    ``x-gearshift-*`` hints, ``gateway.intake.hints``). Returns the whole answer for the caller to send, or None
    when the answer was streamed on ``send`` (its head carrying ``headers``); raises a ``GatewayError`` for an
    error to answer instead, never once a stream has started. ``started`` is the clock's monotonic time when the
    request arrived, ``receive`` the ASGI channel that tells when the client leaves."""
    req = endpoint.parse(raw, gw.body_rules)
    authorise(gw, principal, req)  # 404 / 403 / 400
    gw.overload.brownout_cap(req, principal.tier)  # lower max_tokens while the brownout is on
    call = Call(gw, principal, req, endpoint, request_id, started)
    call.hints = RequestHints.read(request_headers, principal)  # 400 for a malformed or forbidden hint
    tail = None
    with relay.DisconnectGuard(receive) as guard:  # a client that leaves cancels the call
        try:
            call.ticket = await call.admit()  # 429 with the limit that tripped
            ranked = await call.route()  # 503 when no worker qualifies
            async with gw.overload.slot(req, principal, ranked) as queued:  # waits for headroom; 429 / 503 refused
                hold = await call.forward(ranked if queued is None else await call.requeued(queued))  # 502/503/504
                async with hold:  # the one cleanup of the worker's side of the call
                    if not (req.stream and hold.response.status == 200):
                        return await call.whole(hold)
                    tail = await call.stream(hold, send, guard, headers)
        except BaseException as exc:
            if not call.metered:  # failed before a worker answered
                await call.abandon(exc)
            raise
    if tail is not None:  # None: the client left mid-stream
        await send({"type": "http.response.body", "body": tail, "more_body": False})
    return None


def authorise(gw: Gateway, principal: Principal, req: CompletionRequest) -> None:
    """404 for a model no worker serves, 403 for one the tenant may not use, 400 for a ``max_tokens`` beyond the
    model's context window (it would also reserve an absurd number of tokens)."""
    model = gw.fleet.model(req.model)
    if model is None:
        raise errors.ModelNotFound(f"The model '{req.model}' does not exist.", param="model")
    if not principal.tenant.allows(req.model):
        message = f"Tenant '{principal.tenant.id}' may not use the model '{req.model}'."
        raise errors.ModelNotAllowed(message, param="model")
    if req.max_tokens is not None and req.max_tokens > model.context_window:
        message = f"'max_tokens' is {req.max_tokens}; the model's context window is {model.context_window} tokens."
        raise errors.InvalidRequest(message, param="max_tokens")


class Call:
    """One request on its way through the pipeline."""

    ticket: Ticket | None = None
    metered = False
    """The call has been metered (its usage record written and its ticket settled)."""
    hints = RequestHints()
    """The request's checked ``x-gearshift-*`` hints: workload, session and speculation mode."""

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
        self.route_ctx: RouteContext | None = None
        self.deadline = Deadline()
        """The call's waits on the store and its worker: one timer (``gateway.upstream.deadline``)."""
        self.span: Span = trace.INVALID_SPAN
        self.ctx: Context | None = None
        self.traced = gw.tracer is not None
        """Spans are recorded: without a tracer every span is the no-op one, so its attributes are not computed."""
        if gw.tracer is not None:
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

    def _child_span(self, name: str, kind: SpanKind = SpanKind.INTERNAL) -> AbstractContextManager[Span]:
        tracer = self.gw.tracer
        return _NO_SPAN if tracer is None else tracer.start_as_current_span(name, context=self.ctx, kind=kind)

    # ------------------------------------------------------------------------------------------ steps
    async def admit(self) -> Ticket:
        gw, tenant, tokens = self.gw, self.principal.tenant, self.req.reserved_tokens
        with self._child_span("gearshift.admission") as span:
            if self.traced:
                span.set_attribute("gearshift.reserved_tokens", tokens)
            try:
                return await gw.admitter.admit(
                    tenant, request_id=self.request_id, tokens=tokens, deadline=self.deadline
                )
            except errors.RateLimited as exc:
                gw.metrics.rejected(tenant.id, exc.limit)
                if self.traced:
                    span.set_attribute("gearshift.limit", exc.limit)
                raise

    async def route(self) -> list[WorkerView]:
        gw = self.gw
        with self._child_span("gearshift.routing") as span:
            req, ctx = self.req, self.route_ctx
            if ctx is None:
                s = gw.settings
                blocks = (
                    request_blocks(req.body, chat=req.chat, block_chars=s.prefix_block_chars,
                                   max_blocks=s.prefix_max_blocks) if gw.prefix is not None else ()
                )  # fmt: skip
                ctx = RouteContext(
                    model=req.model, tier=self.principal.tier, now=gw.clock.wall(), prompt_tokens=req.prompt_tokens,
                    traffic_class=traffic_class(self.principal.tier_name, self.hints.workload),
                    plan=gw.pool.plans.get(req.model), prefix_blocks=blocks, speculation=self.hints.speculation,
                )  # fmt: skip
            else:  # routed again after queueing: the plan and the time have moved on
                ctx = replace(ctx, now=gw.clock.wall(), plan=gw.pool.plans.get(req.model))
            self.route_ctx = ctx
            decision = await gw.router.route(ctx, list(gw.pool.views.values()))
            if not decision.ranked:
                raise errors.NoWorkerAvailable(
                    f"No healthy worker serves '{self.req.model}'; request id {self.request_id}.",
                    param="model",
                    detail=f"excluded: {decision.filtered_out}",
                    headers={"retry-after": str(max(1, math.ceil(gw.settings.no_worker_retry_after_s)))},
                )
            if self.traced:
                span.set_attribute("gearshift.route.ranked", [w.id for w in decision.ranked])
                span.set_attribute("gearshift.route.scores", [round(decision.scores[w.id], 4) for w in decision.ranked])
            return decision.ranked

    async def requeued(self, waited_s: float) -> list[WorkerView]:
        """The call queued for ``waited_s`` seconds: rank the workers again for the state the wait left."""
        self.span.set_attribute("gearshift.queued_s", waited_s)
        return await self.route()

    async def forward(self, ranked: list[WorkerView]) -> Hold:
        gw, req = self.gw, self.req
        body = req.upstream_body(priority=self.principal.tier.priority if gw.settings.send_priority else None)
        with self._child_span(f"{self.endpoint.operation} {req.model}", SpanKind.CLIENT) as span:
            self.forwarded_at = gw.clock.monotonic()
            hold = await gw.upstream.open(
                ranked, self.endpoint.path, body, stream=req.stream, request_id=self.request_id,
                prompt_tokens=req.prompt_tokens, deadline=self.deadline,
            )  # fmt: skip
            if self.traced:
                span.set_attribute(attr.WORKER, hold.worker.id)
                span.set_attribute(attr.SERVER_ADDRESS, hold.worker.config.url)
                span.set_attribute("gearshift.attempts", hold.attempts)
                span.set_attribute("http.response.status_code", hold.response.status)
                self.span.set_attribute(attr.WORKER, hold.worker.id)
        assert self.route_ctx is not None
        gw.router.picked(self.route_ctx, hold.worker)  # post-pick hooks: the prefix index records
        return hold

    async def whole(self, hold: Hold) -> Response:
        """A non-streamed answer (or a worker's error answer to a stream): read it, meter it, pass it on."""
        try:
            body, usage = await relay.read_whole(hold, timeout_s=self.gw.settings.request_timeout_s)
        except errors.GatewayError as error:
            hold.failure = error
            await self._meter(hold, "error", usage=None, error=error)
            raise
        except BaseException as exc:  # the client went away: account (``_meter`` never suspends)
            await self._meter(hold, _status_of(exc), usage=None)
            raise
        status = hold.response.status
        hold.ok = status < 400
        if status >= 400:  # the worker's own error answer, in the gateway's shape
            refusal = errors.from_worker(status, body)
            await self._meter(hold, "error", usage=None, error=refusal)
            return errors.respond(refusal, self.gw.metrics)
        await self._meter(hold, "ok", usage=usage)
        return Response(body, status_code=status, media_type="application/json")

    async def stream(
        self, hold: Hold, send: Send, guard: relay.DisconnectGuard, headers: Sequence[tuple[bytes, bytes]]
    ) -> bytes:
        """Relay the worker's events, meter the stream, and return the last event: ``[DONE]``, or the error event
        and ``[DONE]``. The settlement goes to the store after it (``LedgerWriter``); this replica's admissions
        count the slot as free at once (``Admitter.finish``), so the client's next request here is never refused
        for this one."""
        gw = self.gw
        meter = self.endpoint.meter(self.req)
        try:
            error = await relay.stream(
                hold, meter, send, guard, headers=headers, clock=gw.clock, idle_timeout_s=gw.settings.idle_timeout_s,
                total_timeout_s=gw.settings.stream_timeout_s,
            )  # fmt: skip
        except BaseException as exc:  # the client went away: account (``_meter`` never suspends)
            await self._meter(hold, _status_of(exc), usage=meter.usage, stream=meter)
            raise
        hold.ok, hold.failure = error is None, error
        await self._meter(hold, "ok" if error is None else "error", meter.usage, meter, error)
        return meter.end(error, gw.metrics)

    # ---------------------------------------------------------------------------------------- metering
    async def _meter(
        self,
        hold: Hold,
        status: str,
        usage: Usage | None,
        stream: StreamMeter | None = None,
        error: errors.GatewayError | None = None,
    ) -> None:
        """Meter the finished call (ledger record, metrics, span) while it still holds its worker, and hand the
        settlement of its admission ticket to the background writer. Never suspends (safe while cancelled)."""
        gw, ticket = self.gw, self.ticket
        assert ticket is not None
        now = gw.clock.monotonic()
        record = usage_record(
            request_id=self.request_id,
            tenant=self.principal.tenant.id,
            model=self.req.model,
            worker=hold.worker,
            status=status,
            usage=usage,
            stream=stream,
            busy_s=now - self.forwarded_at,
            arrived_at=self.started,
            wall=gw.clock.wall(),
            now=now,
            tier=self.principal.tier_name,
            workload=self.hints.workload,
            session=self.hints.session,
            speculation=self.hints.speculation.value,
            pricing=model.pricing if (model := gw.fleet.model(self.req.model)) is not None else None,
            admitted_at=ticket.granted_at,
        )
        self.metered = True
        gw.metrics.finished(record, tier=self.principal.tier_name, duration_s=now - self.started)
        if self.traced:
            self._end_span(error)
            self.span.set_attribute(attr.USAGE_INPUT, record.prompt_tokens)
            self.span.set_attribute(attr.USAGE_OUTPUT, record.completion_tokens)
            self.span.set_attribute("gearshift.cost_usd", record.cost_usd)
            self.span.end()
        used, cost = record.prompt_tokens + record.completion_tokens, record.cost_usd
        gw.ledger.write(record, await gw.admitter.finish(ticket, used_tokens=used, cost_usd=cost))

    def _end_span(self, error: BaseException | None) -> None:
        if isinstance(error, errors.GatewayError):
            self.span.set_attribute(attr.ERROR_TYPE, type(error).__name__)
            self.span.set_status(Status(StatusCode.ERROR, error.detail or error.message))

    async def abandon(self, exc: BaseException) -> None:
        """The request failed before a worker answered: release what admission reserved, end the span."""
        self.deadline.close()
        self._end_span(exc)
        self.span.end()
        if self.ticket is not None:  # never suspends, so it completes even while the call is being cancelled
            settlement = await self.gw.admitter.finish(self.ticket, used_tokens=0, cost_usd=0.0)
            if settlement is not None:
                self.gw.ledger.settle(settlement)


def _status_of(exc: BaseException) -> str:
    """The usage status of a call that ``exc`` ended before it could be metered."""
    return "cancelled" if isinstance(exc, asyncio.CancelledError) else "error"
