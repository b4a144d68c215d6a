"""Unit tests of the gateway's pure parts: body handling, the SSE meter, admission, keys, cost, the ledger."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, cast

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.clock import ManualClock
from fleet.store.memory import MemoryStore
from fleet.store.protocol import ApiKeyRecord, UsageRecord, WorkerState
from gateway.errors import (
    AuthenticationFailed,
    ClientDisconnected,
    InvalidRequest,
    RateLimited,
    StoreUnavailable,
    UpstreamFailed,
    from_worker,
    render,
)
from gateway.intake.admission import Admitter, reason_of
from gateway.intake.auth import KeyRing
from gateway.routing.pool import WorkerPool, WorkerView
from gateway.upstream.body import parse_completion
from gateway.upstream.client import Hold
from gateway.upstream.deadline import Deadline
from gateway.upstream.relay import DisconnectGuard
from gateway.upstream.sse import StreamMeter
from gateway.usage.metering import LedgerWriter, request_cost
from gateway.usage.metrics import E2E, REQUESTS, TOKENS, TPOT, TTFT, GatewayMetrics

from .harness import KEYS, MODEL, PEPPER, body_rules, make_fleet, make_settings, make_tenants


# ------------------------------------------------------------------------------------------------- body
def test_upstream_body_changes_only_stream_options_and_priority() -> None:
    raw = orjson.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "abcd" * 10}], "stream": True, "max_tokens": 9,
         "stream_options": {"continuous_usage_stats": True}, "priority": -5, "vendor": {"a": 1}}
    )  # fmt: skip
    req = parse_completion(raw, prompt_field="messages", rules=body_rules(chars_per_token=4, tokens_per_message=4))
    assert (req.model, req.stream, req.client_wants_usage, req.max_tokens) == (MODEL, True, False, 9)
    assert (req.prompt_tokens, req.reserved_tokens) == (10 + 4 * 2, 10 + 4 * 2 + 9)
    sent = orjson.loads(req.upstream_body(priority=10))
    assert sent["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}
    assert sent["priority"] == 10
    assert sent["vendor"] == {"a": 1}
    assert list(sent) == list(orjson.loads(raw))  # field order kept too


def test_prompt_estimate_counts_text_parts_and_completion_prompts() -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 40}]}]}
    assert parse_completion(orjson.dumps(chat), prompt_field="messages", rules=body_rules()).prompt_parts == (40,)
    rules = body_rules(default_max_tokens=64, chars_per_token=4)
    text = parse_completion(orjson.dumps({"model": MODEL, "prompt": ["ab", "cde"]}), prompt_field="prompt", rules=rules)
    assert sum(text.prompt_parts) == 5
    # two prompts, each completed: 1 + 1 prompt tokens and 2 × 64 completion tokens
    assert text.reserved_tokens == 1 + 1 + 2 * 64
    with pytest.raises(InvalidRequest, match="prompt"):
        parse_completion(orjson.dumps({"model": MODEL}), prompt_field="prompt", rules=body_rules())
    many = {"model": MODEL, "messages": [{"role": "user", "content": "x"}] * 5}
    with pytest.raises(InvalidRequest, match="limit is 4"):
        parse_completion(orjson.dumps(many), prompt_field="messages", rules=body_rules(max_messages=4))


def test_every_choice_reserves_its_completion_allowance() -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "abcd"}], "max_tokens": 50}
    rules = body_rules(default_max_tokens=1, chars_per_token=4, tokens_per_message=4)
    for extra, choices in (({}, 1), ({"n": 8}, 8), ({"n": 2, "best_of": 5}, 5)):
        req = parse_completion(orjson.dumps({**body, **extra}), prompt_field="messages", rules=rules)
        assert req.reserved_tokens == 1 + 8 + 50 * choices
    with pytest.raises(InvalidRequest, match="limit is 16"):
        parse_completion(orjson.dumps({**body, "n": 17}), prompt_field="messages", rules=body_rules(max_n=16))
    with pytest.raises(InvalidRequest, match="'n' must be a positive integer"):
        parse_completion(orjson.dumps({**body, "n": 0}), prompt_field="messages", rules=body_rules())


# -------------------------------------------------------------------------------------------------- SSE
def _chunk(content: str) -> bytes:
    return b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": content}}]}) + b"\n\n"


USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}\n\n'
STREAM = _chunk("") + _chunk("a") + _chunk("b") + _chunk("c") + USAGE + b"data: [DONE]\n\n"


def _run(meter: StreamMeter, parts: list[bytes]) -> bytes:
    out = b""
    for t, part in enumerate(parts):
        out += meter.feed(part, float(t))
    return out


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_stream_meter_output_does_not_depend_on_chunking(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(STREAM)]
    parts = [STREAM[a:b] for a, b in itertools.pairwise(bounds)]
    stripped = StreamMeter(strip_usage=True)
    assert _run(stripped, parts) == STREAM[: STREAM.index(USAGE)]
    assert stripped.done
    assert stripped.usage is not None
    assert (stripped.usage.prompt_tokens, stripped.usage.completion_tokens) == (3, 4)
    assert (stripped.chunk_events, stripped.completion_tokens) == (4, 4)
    kept = StreamMeter(strip_usage=False)
    assert _run(kept, parts) == STREAM[: STREAM.index(b"data: [DONE]")]


def _event_by_event(meter: StreamMeter, block: bytes, now: float) -> bytes:
    """What ``feed`` answers for a block of complete events, computed one event at a time."""
    kept = (meter._keep(event, now) for event in block.split(b"\n\n")[:-1])
    return b"".join(event + b"\n\n" for event in kept if event)


_ERROR_EVENT = b'data: {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}\n\n'
_PLAIN = b"".join(_chunk(c) for c in "abcdefgh")


@pytest.mark.parametrize(
    "block",
    [
        _PLAIN + USAGE + b"data: [DONE]\n\n",  # a whole stream read in one go
        _PLAIN + _chunk("data: [DONE]") + _chunk('"usage"') + USAGE,  # the markers inside a chunk's text
        b"\n\n" + _PLAIN + USAGE,  # an empty event first
        _PLAIN[:-1] + b"\n\n" + USAGE + b"data: [DONE]\n\n",  # a blank line more: an event that starts with one
        _PLAIN + b"\n\n" + USAGE,  # an empty event before the usage
        _PLAIN + _ERROR_EVENT + b"data: [DONE]\n\n",
        b": keep-alive\n\n" + _PLAIN + b"data: [DONE]\n\n",
        _PLAIN,
    ],
    ids=["stream", "markers-in-text", "empty-first", "blank-line-more", "empty-event", "error", "comment", "plain"],
)
@pytest.mark.parametrize("strip", [True, False])
def test_stream_meter_passes_plain_events_as_a_slice_as_it_would_one_by_one(block: bytes, strip: bool) -> None:
    sliced, stepped = StreamMeter(strip_usage=strip), StreamMeter(strip_usage=strip)
    assert sliced.feed(block, 1.0) == _event_by_event(stepped, block, 1.0)
    for field in ("usage", "first_token_at", "last_token_at", "chunk_events", "choice_tokens", "done"):
        assert getattr(sliced, field) == getattr(stepped, field), field


def _running(index: int, content: str, completion_tokens: int) -> bytes:
    """A chunk with vLLM's ``continuous_usage_stats``: its choice's running completion tokens."""
    usage = {"prompt_tokens": 5, "completion_tokens": completion_tokens, "total_tokens": 5 + completion_tokens}
    obj = {"id": "c", "choices": [{"index": index, "delta": {"content": content}}], "usage": usage}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def test_stream_meter_counts_tokens_from_the_running_usage_of_each_choice() -> None:
    """Chunks carry several tokens (one engine step each); a stream cut short is counted in tokens."""
    meter = StreamMeter(strip_usage=True)
    out = meter.feed(_running(0, "", 0) + _running(0, "abc", 3) + _running(1, "de", 2), 1.0)
    out += meter.feed(_running(0, "fghij", 8), 2.0)
    assert (meter.chunk_events, meter.completion_tokens, meter.prompt_tokens) == (4, 8 + 2, 5)
    assert b"usage" not in out
    assert [orjson.loads(e[6:])["choices"][0]["delta"]["content"] for e in out.split(b"\n\n")[:-1]] == [
        "", "abc", "de", "fghij",
    ]  # fmt: skip
    kept = StreamMeter(strip_usage=False, strip_chunk_usage=False)
    assert kept.feed(_running(0, "abc", 3), 1.0) == _running(0, "abc", 3)


def test_a_workers_in_band_error_event_takes_the_gateways_shape() -> None:
    event = b'data: {"error": {"message": "engine died", "type": "InternalServerError", "param": null, "code": 500}}'
    out = StreamMeter(strip_usage=True).feed(event + b"\n\n", 1.0)
    assert orjson.loads(out[6:]) == {
        "error": {"message": "engine died", "type": "api_error", "param": None, "code": None}
    }


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (400, b'{"error": {"message": "bad", "type": "BadRequestError", "param": "n", "code": 400}}',
         ("bad", "invalid_request_error", "n", None)),
        (404, b'{"error": {"message": "gone", "type": "NotFoundError", "code": 404}}',
         ("gone", "not_found_error", None, None)),
        (400, b'{"error": {"message": "m", "type": "invalid_request_error", "code": "context_length_exceeded"}}',
         ("m", "invalid_request_error", None, "context_length_exceeded")),
        (422, b'{"error": {"message": "m", "type": "x", "code": 7, "param": 3}}',
         ("m", "unprocessable_entity_error", None, "7")),
        (413, b"<html>too big</html>",
         ("The worker answered 413 Request Entity Too Large.", "invalid_request_error", None, None)),
        (400, b'{"detail": "x"}', ("The worker answered 400 Bad Request.", "invalid_request_error", None, None)),
        (599, b"", ("The worker answered 599 Error.", "api_error", None, None)),
    ],
)  # fmt: skip
def test_a_workers_error_body_is_mapped_to_the_gateways_shape(
    status: int, body: bytes, expected: tuple[str, str, str | None, str | None]
) -> None:
    error = from_worker(status, body)
    assert error.status == status
    assert orjson.loads(render(error))["error"] == dict(
        zip(("message", "type", "param", "code"), expected, strict=True)
    )


def test_stream_meter_times_first_and_last_token() -> None:
    meter = StreamMeter(strip_usage=True)
    meter.feed(_chunk(""), 1.0)
    meter.feed(_chunk("a") + _chunk("b"), 2.0)
    meter.feed(USAGE, 9.0)
    assert (meter.first_token_at, meter.last_token_at) == (1.0, 2.0)


# ------------------------------------------------------------------------------------------- admission
def test_rejection_reasons_are_a_closed_set() -> None:
    assert [reason_of(k) for k in ("rpm:a", "tpm:a", "concurrency:a", "spend:a", "odd")] == [
        "rpm", "tpm", "concurrency", "budget", "rpm",
    ]  # fmt: skip


def test_retry_after_is_whole_seconds_rounded_up() -> None:
    assert RateLimited("x", limit="rpm", retry_after_s=0.2).headers()["retry-after"] == "1"
    assert RateLimited("x", limit="rpm", retry_after_s=2.01).headers()["retry-after"] == "3"


async def test_admit_then_settle_releases_the_slot_and_refunds_tokens() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    tenant = make_tenants(alpha={"tpm": 100, "max_concurrency": 1, "budget_usd": 1.0}).tenants[0]
    admitter = Admitter(store, clock=clock, metrics=GatewayMetrics())
    ticket = await admitter.admit(tenant, request_id="r1", tokens=80)
    with pytest.raises(RateLimited) as refused:
        await admitter.admit(tenant, request_id="r2", tokens=10)
    assert refused.value.limit == "concurrency"
    settlement = await admitter.finish(ticket, used_tokens=20, cost_usd=0.25)
    assert settlement is not None
    assert await admitter.finish(ticket, used_tokens=20, cost_usd=0.25) is None  # idempotent
    await store.settle_many([settlement, settlement], now=clock.wall())  # a replay is applied once
    refilled = await admitter.admit(tenant, request_id="r3", tokens=80)
    assert await admitter.finish(refilled, used_tokens=80, cost_usd=0.0) is not None
    with pytest.raises(RateLimited) as refused:
        await admitter.admit(tenant, request_id="r4", tokens=1)
    assert refused.value.limit == "tpm"


class BrokenStore(MemoryStore):
    """A shared store that is away: every limit and key call fails."""

    async def admit(self, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("store away")

    async def settle(self, *args: Any, **kwargs: Any) -> None:
        raise ConnectionError("store away")

    async def api_key_by_digest(self, digest: str) -> ApiKeyRecord | None:
        raise ConnectionError("store away")


async def test_store_outage_fails_open_on_local_limits_or_closed() -> None:
    clock = ManualClock()
    metrics = GatewayMetrics()
    tenant = make_tenants(alpha={"rpm": 4, "max_concurrency": 10}).tenants[0]
    fail_open = Admitter(BrokenStore(clock=clock), clock=clock, metrics=metrics, local_share=0.5)
    tickets = [await fail_open.admit(tenant, request_id=f"r{i}", tokens=1) for i in range(2)]
    assert all(t.local for t in tickets)
    with pytest.raises(RateLimited):  # half of rpm 4, enforced locally
        await fail_open.admit(tenant, request_id="r3", tokens=1)
    assert await fail_open.finish(tickets[0], used_tokens=1, cost_usd=0.0) is None  # settled locally
    assert tickets[0].settled
    fail_closed = Admitter(BrokenStore(clock=clock), clock=clock, metrics=metrics, failure_mode="closed")
    with pytest.raises(StoreUnavailable):
        await fail_closed.admit(tenant, request_id="r4", tokens=1)
    assert metrics.store_failures.labels(op="admit")._value.get() == 4


class HungStore:
    """A shared store (not in this process) whose admit never answers."""

    def __init__(self, clock: ManualClock) -> None:
        self._inner = MemoryStore(clock=clock)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def admit(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.Event().wait()


async def test_a_hung_store_fails_the_admit_at_the_store_timeout_on_the_calls_deadline_or_its_own() -> None:
    clock = ManualClock()
    tenant = make_tenants(alpha={"max_concurrency": 10}).tenants[0]
    admitter = Admitter(
        cast(Any, HungStore(clock)), clock=clock, metrics=GatewayMetrics(), failure_mode="closed", store_timeout_s=0.05
    )
    deadline = Deadline()
    async with asyncio.timeout(5):
        with pytest.raises(StoreUnavailable):
            await admitter.admit(tenant, request_id="r1", tokens=1, deadline=deadline)
        with pytest.raises(StoreUnavailable):  # no deadline of the call's: one of its own
            await admitter.admit(tenant, request_id="r2", tokens=1)
        with pytest.raises(TimeoutError), deadline.after(0.01):  # the call's deadline serves its later waits
            await asyncio.Event().wait()
    deadline.close()


# ------------------------------------------------------------------------------------------------ keys
async def test_runtime_keys_are_cached_and_revocation_is_seen_after_the_ttl() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    ring = KeyRing(make_tenants(), store, pepper=PEPPER, clock=clock, cache_ttl_s=5.0)
    assert (await ring.authenticate(f"Bearer {KEYS['alpha']}")).tenant.id == "alpha"
    digest = ring.digest("sk-runtime")
    await store.put_api_key(ApiKeyRecord(key_id="k", tenant="beta", digest=digest, created_at=clock.wall()))
    principal = await ring.authenticate("Bearer sk-runtime")
    assert (principal.tenant.id, principal.tier_name, principal.key_id) == ("beta", "batch", "k")
    await store.revoke_api_key("k")  # revoked through another replica: this one learns after its cache TTL
    assert (await ring.authenticate("Bearer sk-runtime")).tenant.id == "beta"
    clock.advance(5.1)
    with pytest.raises(AuthenticationFailed):
        await ring.authenticate("Bearer sk-runtime")


async def test_store_outage_keeps_known_keys_and_refuses_to_guess_about_others() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    ring = KeyRing(make_tenants(), store, pepper=PEPPER, clock=clock, cache_ttl_s=1.0)
    await store.put_api_key(ApiKeyRecord(key_id="k", tenant="beta", digest=ring.digest("sk-rt"), created_at=0.0))
    assert (await ring.authenticate("Bearer sk-rt")).tenant.id == "beta"
    broken = KeyRing(make_tenants(), BrokenStore(clock=clock), pepper=PEPPER, clock=clock, cache_ttl_s=1.0)
    broken._cache = ring._cache  # the same replica, before and after the store went away
    clock.advance(10)
    assert (await broken.authenticate("Bearer sk-rt")).tenant.id == "beta"
    assert (await broken.authenticate(f"Bearer {KEYS['alpha']}")).tenant.id == "alpha"  # tenants-file keys
    with pytest.raises(StoreUnavailable):
        await broken.authenticate("Bearer sk-unknown")


# ------------------------------------------------------------------------------------------------ cost
def test_cost_uses_the_published_price_else_the_time_share() -> None:
    worker = WorkerView(config=make_fleet(["http://127.0.0.1:1"]).workers[0])
    assert worker.config.usd_per_second == pytest.approx(16 * 3.0 / 3600)
    assert request_cost(worker, completion_tokens=100, busy_s=2.0, concurrent=4) == pytest.approx(
        worker.config.usd_per_second * 2.0 / 4
    )
    worker.state = WorkerState(worker_id="w0", model=MODEL, k_desired=4, k_applied=4, accepted_length=3.0,
                               usd_per_mtok=1.5)  # fmt: skip
    assert request_cost(worker, completion_tokens=100, busy_s=2.0, concurrent=4) == pytest.approx(1.5e-4)


# ---------------------------------------------------------------------------------------------- ledger
class FlakyStore(MemoryStore):
    """Fails the first ``failures`` ledger appends."""

    def __init__(self, failures: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.failures = failures

    async def append_usage(self, record: UsageRecord) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("store away")
        await super().append_usage(record)


async def test_ledger_writer_retries_until_the_store_takes_the_record() -> None:
    clock = ManualClock()
    store = FlakyStore(3, clock=clock)
    metrics = GatewayMetrics()
    writer = LedgerWriter(store, clock=clock, metrics=metrics)
    writer.start()
    record = UsageRecord(request_id="r", tenant="alpha", model=MODEL, worker_id="w0", prompt_tokens=1,
                         completion_tokens=2, cost_usd=0.0, status="ok", at=clock.wall())  # fmt: skip
    writer.append(record)
    async with asyncio.timeout(5):
        await writer.idle()
    await writer.close()
    assert (await store.usage("alpha", since=0, until=1e12)).requests == 1
    assert metrics.loop_errors.labels(loop="ledger")._value.get() == 3


# ------------------------------------------------------------------------------------------------ hold
def _pool(metrics: GatewayMetrics) -> WorkerPool:
    clock = ManualClock()
    fleet = make_fleet(["http://127.0.0.1:1"])
    settings = make_settings(eject_after_failures=2)
    return WorkerPool(fleet=fleet, store=MemoryStore(clock=clock), clock=clock, settings=settings, metrics=metrics)


async def test_a_hold_counts_its_request_until_it_closes_and_then_reports_the_outcome() -> None:
    metrics = GatewayMetrics()
    pool = _pool(metrics)
    view, gauge = pool.views["w0"], metrics.in_flight.labels(worker="w0")
    view.failures = 1
    async with Hold(view, prompt_tokens=100, attempts=1, pool=pool, gauge=gauge) as hold:
        assert (view.in_flight, view.prefill_tokens, gauge._value.get()) == (1, 100, 1)
        hold.answered(b"data: x\n\n")  # the first byte: prefill done
        assert (view.in_flight, view.prefill_tokens) == (1, 0)
        hold.ok = True
    assert (view.in_flight, view.prefill_tokens, gauge._value.get(), view.failures) == (0, 0, 0, 0)

    refused = Hold(view, prompt_tokens=50, attempts=1, pool=pool, gauge=gauge)
    refused.failure, refused.refused = UpstreamFailed("connection refused", request_id="req-1"), True
    await refused.close()  # released before the first byte: its prefill goes too
    assert (view.in_flight, view.prefill_tokens, view.healthy, view.failures) == (0, 0, False, 1)


async def test_a_hold_cut_short_reports_nothing() -> None:
    metrics = GatewayMetrics()
    pool = _pool(metrics)
    view = pool.views["w0"]
    with pytest.raises(asyncio.CancelledError):
        async with Hold(view, prompt_tokens=10, attempts=1, pool=pool, gauge=metrics.in_flight.labels(worker="w0")):
            raise asyncio.CancelledError
    assert (view.in_flight, view.prefill_tokens, view.failures, view.healthy) == (0, 0, 0, True)


# ------------------------------------------------------------------------------------------- disconnect
async def test_a_disconnect_raises_before_the_answer_and_ends_the_call_quietly_after_it_started() -> None:
    async def disconnected() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def wait_forever() -> None:
        await asyncio.Event().wait()

    async with asyncio.timeout(5):
        with pytest.raises(ClientDisconnected), DisconnectGuard(disconnected, arm_after_s=0.0):
            await wait_forever()
        with DisconnectGuard(disconnected, arm_after_s=0.0) as guard:
            guard.answering = True
            await wait_forever()
    assert guard.fired


async def test_each_guard_of_a_loop_arms_when_due_whoever_entered_or_left_before_it() -> None:
    """The guards share one timer: set for a guard that left, it moves on to the next; a guard due sooner than
    the timer sets it sooner."""

    async def disconnected() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def connected() -> dict[str, Any]:
        await asyncio.Event().wait()
        raise AssertionError

    async def guarded(receive: Any, arm_after_s: float) -> None:
        with DisconnectGuard(receive, arm_after_s=arm_after_s):
            await asyncio.Event().wait()

    async with asyncio.timeout(5):
        with DisconnectGuard(disconnected, arm_after_s=0.01):  # leaves before it is due
            pass
        with pytest.raises(ClientDisconnected):
            await guarded(disconnected, 0.02)
        patient = asyncio.create_task(guarded(connected, 60))  # sets the timer for 60 s
        await asyncio.sleep(0)
        with pytest.raises(ClientDisconnected):
            await guarded(disconnected, 0.01)
        patient.cancel()
        with pytest.raises(asyncio.CancelledError):
            await patient


def test_finished_counts_each_label_set_in_its_own_series_and_makes_no_series_it_never_touched() -> None:
    metrics = GatewayMetrics()

    def record(worker: str, status: str, **extra: Any) -> UsageRecord:
        return UsageRecord(request_id="r", tenant="alpha", model="m", worker_id=worker, prompt_tokens=10,
                           completion_tokens=5, cost_usd=0.5, status=status, at=0.0, **extra)  # fmt: skip

    def samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value for m in metrics.registry.collect() for s in m.samples
        }

    metrics.finished(record("w0", "ok"), tier="interactive", duration_s=0.1)
    assert not [key for key in samples() if "cached_prompt" in str(key) or key[0].startswith((TTFT, TPOT))]
    metrics.finished(record("w0", "ok", cached_tokens=4, ttft_s=0.2, tpot_s=0.01), tier="interactive", duration_s=1)
    metrics.finished(record("w1", "error"), tier="batch", duration_s=0.3)
    sample = samples()
    requests = REQUESTS + "_total"
    assert sample[(requests, (("model", "m"), ("status", "ok"), ("tenant", "alpha"), ("worker", "w0")))] == 2
    assert sample[(requests, (("model", "m"), ("status", "error"), ("tenant", "alpha"), ("worker", "w1")))] == 1
    tokens = TOKENS + "_total"
    assert sample[(tokens, (("kind", "prompt"), ("model", "m"), ("tenant", "alpha")))] == 30
    assert sample[(tokens, (("kind", "cached_prompt"), ("model", "m"), ("tenant", "alpha")))] == 4
    assert sample[(E2E + "_count", (("tier", "interactive"),))] == 2
    assert sample[(E2E + "_count", (("tier", "batch"),))] == 1
    assert sample[(TTFT + "_count", (("tier", "interactive"),))] == 1
    assert (TTFT + "_count", (("tier", "batch"),)) not in sample
