"""``bench.chaos.measure.on_one_clock`` (issue 23, the clock-skew fault's "concurrency NOT MET", 4 admitted of 2):
the ledger's ``admitted_at`` and ``at`` are each replica's wall clock, and the fault runs one replica's 2 s ahead,
so an overlap measured across replicas compared two clocks. Hand-made: two replicas alternate two slots without
ever holding more than two; the skewed one's records read 2 s late."""

from __future__ import annotations

from bench.chaos.load import Sent
from bench.chaos.measure import Skew, concurrency_admission, on_one_clock
from bench.soak.client import StreamResult
from fleet.store.protocol import UsageRecord

SKEW_S = 2.0


def _pair(rid: str, gateway: int, start: float, *, skew_s: float = 0.0) -> tuple[UsageRecord, Sent]:
    """A 1 s request the client started at ``start`` (monotonic = the true wall time here), stamped by its replica's
    clock (``skew_s`` ahead)."""
    record = UsageRecord(request_id=rid, tenant="t", model="m", worker_id="w0", prompt_tokens=9, completion_tokens=16,
                         cost_usd=0.001, status="ok", at=start + 1.0 + skew_s, admitted_at=start + skew_s)  # fmt: skip
    result = StreamResult(started=start, ended=start + 1.0, headers={"x-request-id": rid}, status=200, done=True)
    return record, Sent(role="conc", gateway=gateway, result=result)


def _alternating() -> tuple[list[UsageRecord], list[Sent]]:
    """Each second one request on each replica (two slots held, never three); replica 1 skewed from t = 10 to 20."""
    pairs = []
    for t in range(30):
        pairs.append(_pair(f"a{t}", 0, float(t)))
        pairs.append(_pair(f"b{t}", 1, float(t) + 0.5, skew_s=SKEW_S if 10 <= t < 20 else 0.0))
    return [r for r, _ in pairs], [s for _, s in pairs]


def test_records_of_a_skewed_replica_are_measured_on_the_others_clock() -> None:
    records, sent = _alternating()
    as_stamped = concurrency_admission(records, 2, refused=True, store_lost=False)
    assert as_stamped.admitted > 2  # the two clocks compared: what the report showed
    skews = [Skew(gateway=1, since=10.0, until=20.0, offset_s=SKEW_S)]
    corrected = concurrency_admission(on_one_clock(records, sent, skews), 2, refused=True, store_lost=False)
    assert corrected.admitted == 2
    assert corrected.within_bound


def test_only_the_skewed_replicas_requests_in_its_window_move() -> None:
    records, sent = _alternating()
    moved = on_one_clock(records, sent, [Skew(gateway=1, since=10.0, until=20.0, offset_s=SKEW_S)])
    changed = {r.request_id for r, m in zip(records, moved, strict=True) if r != m}
    assert changed == {f"b{t}" for t in range(10, 20)}
    assert all(m.at == r.at - SKEW_S for r, m in zip(records, moved, strict=True) if r.request_id in changed)
    assert on_one_clock(records, sent, []) == records
