"""The soak's request-by-request ledger check (``bench.soak.ledger``): each kind of difference is found."""

from __future__ import annotations

from bench.soak.client import StreamResult
from bench.soak.ledger import ledger_diff
from fleet.store.protocol import UsageRecord


def _answered(rid: str, prompt: int = 10, completion: int = 20) -> StreamResult:
    return StreamResult(status=200, started=0.0, done=True, prompt_tokens=prompt, completion_tokens=completion,
                        usage_seen=True, headers={"x-request-id": rid})  # fmt: skip


def _failed(rid: str) -> StreamResult:
    return StreamResult(
        status=200, started=0.0, done=True, error={"type": "upstream_error"}, headers={"x-request-id": rid}
    )


def _record(rid: str, prompt: int = 10, completion: int = 20, status: str = "ok") -> UsageRecord:
    return UsageRecord(request_id=rid, tenant="t", model="m", worker_id="w", prompt_tokens=prompt,
                       completion_tokens=completion, cost_usd=0.0, status=status, at=1.0)  # fmt: skip


def test_an_exact_ledger_has_no_differences_and_a_failed_request_billed_is_counted_apart() -> None:
    diff = ledger_diff(
        [_answered("a"), _answered("b"), _failed("c")], [_record("a"), _record("b"), _record("c", status="error")]
    )
    assert diff.differences == 0
    assert (diff.answered, diff.records, diff.unanswered_billed) == (2, 3, 1)


def test_each_kind_of_difference_is_counted() -> None:
    clients = [_answered("missing"), _answered("twice"), _answered("wrong", completion=20), _answered("ok")]
    records = [_record("twice"), _record("twice"), _record("wrong", completion=19), _record("ok"), _record("stray")]
    diff = ledger_diff(clients, records)
    assert (diff.missing, diff.duplicate, diff.wrong_amount, diff.unknown) == (1, 1, 1, 1)
    assert diff.differences == 4
    assert "missing missing" in diff.examples


def test_an_answered_request_without_a_request_id_cannot_be_matched() -> None:
    anonymous = _answered("x")
    anonymous.headers.clear()
    assert ledger_diff([anonymous], []).no_request_id == 1
    assert ledger_diff([anonymous], []).differences == 1
