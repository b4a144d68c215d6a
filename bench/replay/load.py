"""A trace as the lab's arrival process: open-loop requests at their recorded times, sessions as closed loops.

A request without a session arrives at its recorded time, whatever the policy does. The turns of a session
are replayed as the session ran: its first turn at its recorded arrival, each later turn only once the previous
one has finished in the replay, after the recorded think time (the gap from the previous turn's recorded finish
to this turn's recorded arrival; 0 when the trace has no finish times). So a slower policy sees a session's
later turns later, as a real user waiting for answers would send them. Nothing is sent at or after ``end_s``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from bench.replay.trace import TraceRequest
from workers.sim.arrivals import LoadContext, RequestSpec


@dataclass(frozen=True, slots=True)
class _Turn:
    spec: RequestSpec
    think_s: float


def think_times(turns: Sequence[TraceRequest]) -> list[float]:
    """Each turn's pause after the previous turn's finish, seconds (the first turn's entry is 0)."""
    out = [0.0]
    for before, turn in itertools.pairwise(turns):
        finished = before.finish_s
        out.append(0.0 if finished is None else max(0.0, turn.arrival_s - finished))
    return out


class TraceReplay:
    """``workers.sim.arrivals.ArrivalProcess`` of a trace (see the module docstring)."""

    def __init__(
        self,
        requests: Sequence[TraceRequest],
        specs: Sequence[RequestSpec],
        *,
        end_s: float,
        phase: str = "trace",
    ) -> None:
        """``specs[i]`` is what ``requests[i]`` runs as (workload class, lengths, priority, tier tag)."""
        self.end_s = end_s
        self.phase = phase
        self._open = [(r.arrival_s, s) for r, s in zip(requests, specs, strict=True) if r.session is None]
        by_session: dict[str, list[tuple[TraceRequest, RequestSpec]]] = {}
        for r, s in zip(requests, specs, strict=True):
            if r.session is not None:
                by_session.setdefault(r.session, []).append((r, s))
        self._sessions: list[tuple[float, list[_Turn]]] = []
        for pairs in by_session.values():
            thinks = think_times([r for r, _ in pairs])
            turns = [_Turn(s, think) for (_, s), think in zip(pairs, thinks, strict=True)]
            self._sessions.append((pairs[0][0].arrival_s, turns))
        self._next_turn = [0] * len(self._sessions)

    @property
    def request_count(self) -> int:
        """Requests the trace holds (a session's later turns may fall past ``end_s`` in a slow replay)."""
        return len(self._open) + sum(len(turns) for _, turns in self._sessions)

    def start(self, ctx: LoadContext) -> None:
        for at_s, spec in self._open:
            if at_s < self.end_s:
                ctx.submit_at(at_s, spec, phase=self.phase)
        for stream, (at_s, _) in enumerate(self._sessions):
            self._send(stream, at_s, ctx)

    def on_stream_done(self, stream: int, ctx: LoadContext) -> None:
        turns = self._sessions[stream][1]
        index = self._next_turn[stream]
        if index < len(turns):
            self._send(stream, ctx.now_s + turns[index].think_s, ctx)

    def _send(self, stream: int, at_s: float, ctx: LoadContext) -> None:
        if at_s >= self.end_s:
            return
        index = self._next_turn[stream]
        self._next_turn[stream] = index + 1
        ctx.submit_at(at_s, self._sessions[stream][1][index].spec, stream=stream, phase=self.phase)
