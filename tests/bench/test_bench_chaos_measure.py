"""``bench.chaos.measure``: what counts as a clean failure, a ledger difference, over-admission and recovery, on
hand-made client results and ledger records (the chaos bench's verdicts rest on these)."""

from __future__ import annotations

from typing import Any

from bench.chaos.load import Sent
from bench.chaos.measure import (
    Kill,
    budget_admission,
    concurrency_admission,
    failures,
    most_in_window,
    rpm_admission,
    time_to_recover,
)
from bench.soak.client import StreamResult
from fleet.store.protocol import UsageRecord


def _sent(
    rid: str, *, role: str = "free", gateway: int = 0, started: float = 0.0, ended: float = 1.0, **kw: Any
) -> Sent:
    disconnected = kw.pop("disconnected", False)
    fields: dict[str, Any] = {"status": 200, "done": True, "usage_seen": True, "prompt_tokens": 9,
                              "completion_tokens": 16, **kw}  # fmt: skip
    r = StreamResult(started=started, ended=ended, headers={"x-request-id": rid}, **fields)
    return Sent(role=role, gateway=gateway, result=r, disconnected=disconnected)


def _record(rid: str, *, at: float = 100.0, admitted_at: float | None = 99.0, **kw: Any) -> UsageRecord:
    fields: dict[str, Any] = {"prompt_tokens": 9, "completion_tokens": 16, "cost_usd": 0.01, "status": "ok", **kw}
    return UsageRecord(request_id=rid, tenant="t", model="m", worker_id="w0", at=at, admitted_at=admitted_at,
                       **fields)  # fmt: skip


def test_an_error_event_then_done_is_clean_and_a_broken_stream_is_not() -> None:
    sent = [
        _sent("a"),
        _sent("b", error={"type": "api_error"}),  # error event + [DONE]
        _sent("c", error={"type": "api_error"}, done=False),  # error event, no [DONE]
        _sent("d", done=False, transport_error="ClientPayloadError()"),
        _sent("e", status=503, done=False, error={"type": "service_unavailable"}),  # 5xx with a body
        _sent("f", status=502, done=False, error={"type": "not_json"}),  # 5xx without an OpenAI body
    ]
    f = failures(sent)
    assert (f.requests, f.ok, f.failed, f.unclean) == (6, 1, 5, 3)


def test_a_client_that_gave_up_waiting_is_a_client_timeout() -> None:
    sent = [_sent("a", done=False, transport_error="TimeoutError()"), _sent("b", done=False, transport_error="reset")]
    assert failures(sent).kinds == {"client_timeout": 1, "transport": 1}


def test_intended_refusals_and_drops_are_not_failures_but_a_free_tenants_429_is() -> None:
    sent = [
        _sent("a", role="rpm", status=429, done=False, error={"type": "rate_limit_exceeded"}),
        _sent("b", disconnected=True, done=False),
        _sent("c", status=429, done=False, error={"type": "rate_limit_exceeded"}),
    ]
    f = failures(sent)
    assert (f.intended, f.failed, f.unclean) == (2, 1, 0)


def test_a_transport_error_on_the_killed_replica_counts_apart_from_one_elsewhere() -> None:
    kill = Kill(gateway=1, at=5.0, noticed_at=6.0)
    sent = [
        _sent("a", gateway=1, started=4.0, ended=5.1, done=False, transport_error="reset"),
        _sent("b", gateway=0, started=4.0, ended=5.1, done=False, transport_error="reset"),
        _sent("c", gateway=1, started=7.0, ended=7.1, done=False, transport_error="refused"),  # after it was noticed
    ]
    f = failures(sent, [kill])
    assert (f.broken_by_kill, f.failed, f.unclean) == (1, 2, 2)


def test_the_most_in_any_window_slides() -> None:
    assert most_in_window([]) == 0
    points = [(0.0, 1.0), (30.0, 1.0), (59.9, 1.0), (60.0, 1.0), (61.0, 5.0)]
    assert most_in_window(points, 60.0) == 8.0  # 30 .. 89.9 holds the last four
    assert most_in_window([(0.0, 1.0), (60.0, 1.0)], 60.0) == 1.0


def test_rpm_over_the_bucket_slack_is_beyond_the_bound_unless_the_store_was_lost() -> None:
    records = [_record(str(i), admitted_at=i * 0.5) for i in range(62)]  # all within 31 s
    assert not rpm_admission(records, 60, refused=True, store_lost=False).within_bound
    assert rpm_admission(records[:61], 60, refused=True, store_lost=False).within_bound
    assert rpm_admission(records, 60, refused=True, store_lost=True).within_bound


def test_concurrency_counts_overlapping_admitted_requests() -> None:
    records = [_record("a", admitted_at=0.0, at=2.0), _record("b", admitted_at=1.0, at=3.0),
               _record("c", admitted_at=1.5, at=1.6)]  # fmt: skip
    assert concurrency_admission(records, 3, refused=True, store_lost=False).within_bound
    over = concurrency_admission(records, 2, refused=True, store_lost=False)
    assert (over.admitted, over.within_bound) == (3, False)


def test_budget_bound_is_the_clients_in_flight_at_the_largest_cost() -> None:
    records = [_record("a", cost_usd=0.01), _record("b", cost_usd=0.02)]
    assert budget_admission(records, 1.0, 1.04, clients=2, refused=True, store_lost=False).within_bound
    assert not budget_admission(records, 1.0, 1.05, clients=2, refused=True, store_lost=False).within_bound


def test_recovery_runs_from_the_heal_to_the_first_request_after_the_last_failure() -> None:
    sent = [
        _sent("a", started=1.0),
        _sent("b", started=11.0, error={"type": "api_error"}),
        _sent("c", started=12.5),
        _sent("d", started=13.0),
    ]
    assert time_to_recover(sent, healed_at=10.0) == 2.5
    assert time_to_recover(sent[:1], healed_at=10.0) == 0.0
    assert time_to_recover(sent[:2], healed_at=10.0) is None  # still failing at the end
