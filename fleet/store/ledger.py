"""Per-tenant usage index with roll-ups, so totals over any time range cost O(hours) rather than
O(records). ``MemoryStore`` uses ``TenantLedger`` directly; ``RedisStore``'s Lua runs the same steps
(``fleet.store.lua.APPEND_USAGE`` and ``USAGE``), in the same order, so the totals agree to the bit.

Each record adds to one roll-up per size in ``ROLLUP_SIZES_S`` (hours, then minutes). A range
``[since, until)``, first clamped to the tenant's first and last record, is split into whole hours in
the middle, whole minutes at the two edges, and single records for the last partial minutes: at most
two minutes of records are read, whatever the range.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice

from fleet.store.protocol import UsageRecord, UsageTotals

ROLLUP_SIZES_S = (3600.0, 60.0)
"""Roll-up granularities, seconds, coarsest first."""


@dataclass
class Sums:
    """Running totals; ``cost_usd`` is added in a fixed order so both stores round alike."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def add(self, requests: int, prompt: int, completion: int, cost_usd: float) -> None:
        self.requests += requests
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.cost_usd += cost_usd


@dataclass
class TenantLedger:
    """One tenant's records (sorted by time, then text, like a Redis sorted set) and roll-ups."""

    entries: list[tuple[float, str]] = field(default_factory=list)
    request_ids: set[str] = field(default_factory=set)
    rollups: dict[tuple[float, int], Sums] = field(default_factory=dict)
    records_read: int = field(default=0, compare=False)
    """How many stored records have been read one by one so far (the cost a roll-up saves)."""

    def append(self, record: UsageRecord) -> bool:
        """Add ``record``; False (and nothing changes) when a record with its request id is already there."""
        if record.request_id in self.request_ids:
            return False
        self.request_ids.add(record.request_id)
        bisect.insort(self.entries, (record.at, record.model_dump_json()))
        for size in ROLLUP_SIZES_S:
            sums = self.rollups.setdefault((size, math.floor(record.at / size)), Sums())
            sums.add(1, record.prompt_tokens, record.completion_tokens, record.cost_usd)
        return True

    def cutoff(self, keep: int) -> float | None:
        """The ``at`` of the oldest of the newest ``keep`` records; None when there are no more than ``keep``."""
        return self.entries[-keep][0] if len(self.entries) > keep else None

    def trim(self, before: float, expected: int) -> int | None:
        """Remove the records with ``at < before``, their ids and the roll-ups wholly before ``before``, if exactly
        ``expected`` are there (else None, nothing changed). Returns how many it removed (``lua.TRIM_USAGE``)."""
        end = bisect.bisect_left(self.entries, (before, ""))
        if end != expected:
            return None
        for _, text in self.entries[:end]:
            self.request_ids.discard(UsageRecord.model_validate_json(text).request_id)
        del self.entries[:end]
        for size, unit in [k for k in self.rollups if (k[1] + 1) * k[0] <= before]:
            del self.rollups[(size, unit)]
        return end

    def texts(self, since: float, until: float, limit: int) -> list[str]:
        """The JSON text of the first ``limit`` records with ``since <= at < until``, in time order."""
        return list(islice(self._texts(since, until), limit))

    def _texts(self, since: float, until: float) -> Iterator[str]:
        start = bisect.bisect_left(self.entries, (since, ""))
        for at, text in self.entries[start:]:
            if at >= until:
                return
            self.records_read += 1
            yield text

    def usage(self, since: float, until: float, limit: int) -> UsageTotals:
        records = [UsageRecord.model_validate_json(t) for t in self.texts(since, until, limit)]
        sums = Sums()
        if self.entries:
            lo, hi = max(since, self.entries[0][0]), min(until, self.entries[-1][0] + 1)
            if lo < hi:
                self._split(sums, lo, hi, 0)
        return UsageTotals(sums.requests, sums.prompt_tokens, sums.completion_tokens, sums.cost_usd, tuple(records))

    def _split(self, sums: Sums, lo: float, hi: float, level: int) -> None:
        if level == len(ROLLUP_SIZES_S):
            for text in self._texts(lo, hi):
                r = UsageRecord.model_validate_json(text)
                sums.add(1, r.prompt_tokens, r.completion_tokens, r.cost_usd)
            return
        size = ROLLUP_SIZES_S[level]
        first, end = math.ceil(lo / size), math.floor(hi / size)
        if first >= end:
            self._split(sums, lo, hi, level + 1)
            return
        self._split(sums, lo, first * size, level + 1)
        for unit in range(first, end):
            part = self.rollups.get((size, unit))
            if part is not None:
                sums.add(part.requests, part.prompt_tokens, part.completion_tokens, part.cost_usd)
        self._split(sums, end * size, hi, level + 1)
