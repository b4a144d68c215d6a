"""Which positions a skipped drafter has not seen: the ledger behind the idle-drafter skip's catch-up.

When every request of a step runs at k = 0, the plugin skips the drafter (``workers.vllm.idle_v1``). A drafter
with its own context (a draft model's KV cache) then has a hole at every position those steps computed; the
first step at k > 0 fills it in one batched forward before drafting. This module only keeps the accounts, so it
is pure and testable without vLLM: per request, the contiguous run of positions ``[first, end)`` it skipped, as
segments of stashed steps (a step's token and position tensors are stashed once, whole; a segment names a slice
of one stash).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Segment(NamedTuple):
    """``length`` tokens of request at positions ``first … first + length - 1``, rows ``offset …`` of stash ``step``.
    A tuple: one is made per request on every skipped step."""

    step: int
    offset: int
    first: int
    length: int

    @property
    def end(self) -> int:
        return self.first + self.length


@dataclass(slots=True)
class Lag:
    """One request's skipped run; ``complete`` is False once a gap made it unrecoverable (a preemption that
    recomputed from a cached prefix while skipped): its drafts are then drafted on a stale context, which costs
    acceptance, never correctness (verification is lossless). ``end``: its last segment's end, kept as it grows."""

    segments: list[Segment] = field(default_factory=list)
    complete: bool = True
    end: int = 0

    @property
    def first(self) -> int:
        return self.segments[0].first


def _ints(values: Sequence[int] | Any, n: int) -> list[int]:
    """The first ``n`` of ``values`` (a sequence or a numpy array) as Python ints, in one call for an array."""
    head = values[:n]
    return head.tolist() if hasattr(head, "tolist") else [int(v) for v in head]


@dataclass(frozen=True)
class CatchUp:
    """The catch-up of one request: the batch row it has in this step and the segments to replay, in order.
    The replayed positions are ``first … end - 1`` and ``end`` is where this step's own tokens start."""

    row: int
    req_id: str
    segments: tuple[Segment, ...]

    @property
    def first(self) -> int:
        return self.segments[0].first

    @property
    def end(self) -> int:
        return self.segments[-1].end

    @property
    def length(self) -> int:
        return self.end - self.first


class DrafterLag:
    """Per request, the positions computed by the target on steps that skipped the drafter."""

    def __init__(self) -> None:
        self._lags: dict[str, Lag] = {}
        self._next_step = 0

    def __bool__(self) -> bool:
        return bool(self._lags)

    def skipped(self, req_ids: Sequence[str], query_start: Sequence[int], first_positions: Sequence[int]) -> int:
        """Record a skipped step: request ``req_ids[i]`` computed ``query_start[i + 1] - query_start[i]`` tokens
        from position ``first_positions[i]``, rows ``query_start[i] …`` of the step's stash. Returns the stash id.
        Runs on every skipped step: one pass, no per-request conversions."""
        step = self._next_step
        self._next_step += 1
        n = len(req_ids)
        starts = _ints(query_start, n + 1)
        lags = self._lags
        for req_id, lo, hi, first in zip(req_ids, starts[:-1], starts[1:], _ints(first_positions, n), strict=True):
            length = hi - lo
            if length <= 0:
                continue
            segment = Segment(step, lo, first, length)
            lag = lags.get(req_id)
            if lag is None:
                lags[req_id] = Lag([segment], end=first + length)
            elif first == lag.end:
                lag.segments.append(segment)
                lag.end = first + length
            else:  # recomputed after a preemption: from 0 the new run is whole, else its prefix is unknown
                lags[req_id] = Lag([segment], complete=first == 0, end=first + length)
        return step

    def due(self, req_ids: Sequence[str], first_positions: Sequence[int]) -> list[CatchUp]:
        """The catch-ups this step (whose request ``req_ids[i]`` starts at ``first_positions[i]``) must run before
        drafting; those requests leave the ledger. A run that does not end where the step starts is not replayed."""
        due = []
        for row, req_id in enumerate(req_ids):
            lag = self._lags.pop(req_id, None)
            if lag is None or not lag.complete or lag.end != int(first_positions[row]):
                continue
            due.append(CatchUp(row=row, req_id=req_id, segments=tuple(lag.segments)))
        return due

    def forget_all_but(self, live: Iterable[str]) -> None:
        """Drop finished requests (``live``: the runner's current requests)."""
        keep = set(live)
        for req_id in [r for r in self._lags if r not in keep]:
            del self._lags[req_id]

    def stashes_in_use(self) -> set[int]:
        return {s.step for lag in self._lags.values() for s in lag.segments}


def pack(catch_ups: Sequence[CatchUp], *, max_tokens: int) -> list[list[tuple[CatchUp, int, int]]]:
    """Split the replay into forwards of at most ``max_tokens`` tokens: each forward a list of
    ``(catch_up, first, end)`` pieces, at most one piece per request, a request's pieces in position order
    across forwards (a later piece attends to the KV an earlier forward wrote)."""
    if max_tokens <= 0:
        raise ValueError("max_tokens must be positive")
    cursors = {c.req_id: c.first for c in catch_ups}
    forwards: list[list[tuple[CatchUp, int, int]]] = []
    while any(cursors[c.req_id] < c.end for c in catch_ups):
        budget = max_tokens
        forward = []
        for c in catch_ups:
            start = cursors[c.req_id]
            if start >= c.end or budget == 0:
                continue
            stop = min(c.end, start + budget)
            forward.append((c, start, stop))
            budget -= stop - start
            cursors[c.req_id] = stop
        forwards.append(forward)
    return forwards
