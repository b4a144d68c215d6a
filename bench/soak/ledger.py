"""The soak's exact ledger check: each request the clients saw answered, by its ``x-request-id``, is in the usage
ledger once with the token counts its usage block gave; no record belongs to a request no client sent. Pure: the
records and what the clients saw in, the differences out.

A request the client did not see answered (an error event, a broken stream) may still be billed for the work the
worker did; such records are counted apart, not as differences. A 429 is refused before any work and has no record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bench.soak.client import StreamResult
from fleet.store.protocol import UsageRecord

REQUEST_ID = "x-request-id"


@dataclass(frozen=True, slots=True)
class LedgerDiff:
    answered: int
    """Requests the clients saw answered (200, ``[DONE]``, no error) with a request id."""
    records: int
    missing: int
    """Answered requests with no record."""
    duplicate: int
    """Request ids with more than one record."""
    wrong_amount: int
    """Answered requests whose record's prompt or completion tokens differ from the client's usage block."""
    unknown: int
    """Records whose request id no client received."""
    no_request_id: int
    """Answered requests without an ``x-request-id`` header (cannot be matched: a difference)."""
    unanswered_billed: int
    """Records of requests the client saw fail (billed for the work done; not a difference)."""
    examples: list[str] = field(default_factory=list)

    @property
    def differences(self) -> int:
        return self.missing + self.duplicate + self.wrong_amount + self.unknown + self.no_request_id


def ledger_diff(results: Iterable[StreamResult], records: Sequence[UsageRecord]) -> LedgerDiff:
    """Compare the clients' requests with the ledger's records, request by request."""
    answered: dict[str, StreamResult] = {}
    failed: set[str] = set()
    no_id = 0
    for r in results:
        rid = r.headers.get(REQUEST_ID)
        if r.ok:
            if rid is None:
                no_id += 1
            else:
                answered[rid] = r
        elif rid is not None:
            failed.add(rid)
    counts = Counter(rec.request_id for rec in records)
    by_id = {rec.request_id: rec for rec in records}
    missing = [rid for rid in answered if rid not in by_id]
    duplicate = [rid for rid, n in counts.items() if n > 1]
    wrong = [
        rid
        for rid, r in answered.items()
        if rid in by_id
        and (by_id[rid].prompt_tokens, by_id[rid].completion_tokens) != (r.prompt_tokens, r.completion_tokens)
    ]
    unknown = [rid for rid in counts if rid not in answered and rid not in failed]
    examples = [f"{kind} {rid}" for kind, ids in (("missing", missing), ("duplicate", duplicate), ("wrong", wrong),
                                                   ("unknown", unknown)) for rid in ids[:2]]  # fmt: skip
    return LedgerDiff(
        answered=len(answered),
        records=len(records),
        missing=len(missing),
        duplicate=len(duplicate),
        wrong_amount=len(wrong),
        unknown=len(unknown),
        no_request_id=no_id,
        unanswered_billed=sum(1 for rid in failed if rid in by_id),
        examples=examples,
    )
