"""The worker speculation-control contract (DESIGN §3.1): its route, schedule tables, the wire schemas, and the
versioned, leased state machine that both the simulated worker and the vLLM plugin run (the HTTP client that
every caller uses is ``fleet.speculation_client``).

A *schedule* maps decode batch sizes to a speculation length k: rows ``(from_bs, to_bs, k)`` that
together cover ``1 … max_num_seqs`` with no gap and no overlap. ``k = 0`` turns speculation off.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field

from fleet.clock import Clock

SPECULATION_PATH: Final = "/gearshift/v1/speculation"
"""The control API's route on every worker (simulated or vLLM): ``GET`` reads, ``PUT`` updates."""

ScheduleRow = tuple[int, int, int]
"""``(from_bs, to_bs, k)``: batch sizes ``from_bs … to_bs`` inclusive run with k draft tokens."""
Schedule = tuple[ScheduleRow, ...]


class ScheduleError(ValueError):
    """A schedule table is malformed; the message names the offending row and rule."""


class StaleVersionError(ValueError):
    """A PUT carried a version older than the applied one (HTTP 409)."""


def validate_schedule(rows: Sequence[Sequence[int]], *, k_max: int, max_num_seqs: int) -> Schedule:
    """Check and normalise a schedule table; raise ``ScheduleError`` naming the first bad row."""
    if not rows:
        raise ScheduleError("schedule: must have at least one row")
    out: list[ScheduleRow] = []
    expected_from = 1
    for i, row in enumerate(rows):
        if len(row) != 3 or not all(isinstance(v, int) and not isinstance(v, bool) for v in row):
            raise ScheduleError(f"schedule[{i}]: must be three integers [from_bs, to_bs, k], got {list(row)}")
        from_bs, to_bs, k = row
        if from_bs != expected_from:
            kind = "gap" if from_bs > expected_from else "overlap"
            raise ScheduleError(f"schedule[{i}]: {kind}: row starts at batch size {from_bs}, expected {expected_from}")
        if to_bs < from_bs:
            raise ScheduleError(f"schedule[{i}]: to_bs {to_bs} is below from_bs {from_bs}")
        if k < 0:
            raise ScheduleError(f"schedule[{i}]: k {k} is negative")
        if k > k_max:
            raise ScheduleError(f"schedule[{i}]: k {k} exceeds this worker's k_max {k_max}")
        out.append((from_bs, to_bs, k))
        expected_from = to_bs + 1
    if out[-1][1] < max_num_seqs:
        raise ScheduleError(
            f"schedule[{len(out) - 1}]: gap: table ends at batch size {out[-1][1]}, "
            f"must reach max_num_seqs {max_num_seqs}"
        )
    # Rows past max_num_seqs are harmless (the engine never forms such batches); clip them for display.
    return tuple(out)


FullSpeedRow = tuple[int, int, int]
"""``(k, from_bs, to_bs)``: uniform decode batches of ``from_bs … to_bs`` sequences at this k run at full speed
(on a GPU vLLM worker: they replay a captured CUDA graph)."""
FullSpeed = tuple[FullSpeedRow, ...]


def full_speed_rows(pairs: Iterable[tuple[int, int]]) -> FullSpeed:
    """Compress ``(k, batch_size)`` pairs into rows ``(k, from_bs, to_bs)``, sorted by k then batch size."""
    rows: list[FullSpeedRow] = []
    for k, bs in sorted(set(pairs)):
        if rows and rows[-1][0] == k and rows[-1][2] == bs - 1:
            rows[-1] = (k, rows[-1][1], bs)
        else:
            rows.append((k, bs, bs))
    return tuple(rows)


def check_full_speed(schedule: Schedule, full_speed: FullSpeed) -> None:
    """Raise ``ScheduleError`` naming the first row that puts a k outside ``full_speed`` at a batch size.

    Only batch sizes where some k runs at full speed are checked: where none does (a batch wider than every
    captured graph), every k runs the same slow path and none is refused.
    """
    covered = {(k, bs) for k, lo, hi in full_speed for bs in range(lo, hi + 1)}
    constrained = {bs for _, bs in covered}
    for i, (from_bs, to_bs, k) in enumerate(schedule):
        bad = [bs for bs in range(from_bs, to_bs + 1) if bs in constrained and (k, bs) not in covered]
        if bad:
            ranges = [f"{lo}-{hi}" for k_row, lo, hi in full_speed if k_row == k] or ["none"]
            raise ScheduleError(
                f"schedule[{i}]: k {k} at batch size {bad[0]} is outside this worker's full-speed set "
                f"(k {k} runs at full speed for batch sizes {', '.join(ranges)}; see full_speed in GET)"
            )


def uniform_schedule(k: int, *, max_num_seqs: int) -> Schedule:
    """The one-row schedule ``[[1, max_num_seqs, k]]``."""
    return ((1, max_num_seqs, k),)


def k_for_batch(schedule: Schedule, batch_size: int) -> int:
    """The k that ``schedule`` assigns to a decode batch of ``batch_size`` sequences."""
    for from_bs, to_bs, k in schedule:
        if from_bs <= batch_size <= to_bs:
            return k
    return schedule[-1][2] if batch_size > schedule[-1][1] else schedule[0][2]


def dense_lookup(schedule: Schedule, *, max_num_seqs: int) -> list[int]:
    """The schedule as vLLM's dense list: index b holds the k for batch size b (index 0 unused, = k at 1)."""
    return [k_for_batch(schedule, max(b, 1)) for b in range(max_num_seqs + 1)]


class SpeculationUpdate(BaseModel):
    """Body of ``PUT /gearshift/v1/speculation``."""

    model_config = ConfigDict(extra="forbid")

    schedule: list[list[int]] | None = None
    k: Annotated[int | None, Field(ge=0)] = None
    version: Annotated[int, Field(ge=0)]
    lease_seconds: Annotated[float, Field(gt=0, le=3600)] = 30.0
    reason: str = ""


class SpeculationState(BaseModel):
    """Body of ``GET /gearshift/v1/speculation``. Times are Unix seconds."""

    worker_id: str
    method: str
    k_max: int
    schedule: list[list[int]]
    version: int
    applied_at: float
    lease_expires_at: float | None
    fallback_schedule: list[list[int]]
    reason: str = ""
    full_speed: list[list[int]] | None = None
    """``[[k, from_bs, to_bs], …]``: the (k, batch size) pairs this worker runs at full speed; a PUT outside them
    is refused (400). Absent or null: every k runs at full speed at every batch size (the simulator; an eager
    worker, such as the CPU build, where no shape has a faster path)."""


@dataclass
class SpeculationControl:
    """Versioned, leased speculation schedule of one worker: the mechanism behind §3.1.

    The worker starts on its ``fallback`` schedule (version 0, no lease). ``apply`` installs a newer
    schedule with a lease; ``expire`` (called before each engine step) reverts to the fallback once the
    lease runs out, so a dead controller never strands a worker in a bad state.
    """

    worker_id: str
    method: str
    k_max: int
    max_num_seqs: int
    fallback: Schedule
    clock: Clock
    schedule: Schedule = ()
    version: int = 0
    applied_at: float = 0.0
    lease_expires_at: float | None = None
    reason: str = "start-up schedule"
    lease_expiries: int = 0
    last_put: Schedule = ()
    """The schedule the applied version was PUT with: a re-PUT of that version (a lease renewal) must match it,
    even after the lease expired and the worker fell back."""
    full_speed: FullSpeed | None = None
    """What this worker runs at full speed (``SpeculationState.full_speed``); None: everything. PUTs are held to
    it; the fallback is not (it is the start-up table, which the worker already runs)."""

    def __post_init__(self) -> None:
        self.fallback = validate_schedule(self.fallback, k_max=self.k_max, max_num_seqs=self.max_num_seqs)
        if not self.schedule:
            self.schedule = self.fallback
            self.applied_at = self.clock.wall()

    def apply(self, update: SpeculationUpdate) -> SpeculationState:
        """Install ``update``; idempotent for the applied version, 409 for an older one, 400 for a bad table."""
        if update.version < self.version:
            raise StaleVersionError(f"version: {update.version} is older than the applied version {self.version}")
        if (update.schedule is None) == (update.k is None):
            raise ScheduleError("schedule: give exactly one of 'schedule' or 'k'")
        rows = update.schedule if update.schedule is not None else [[1, self.max_num_seqs, int(update.k or 0)]]
        schedule = validate_schedule(rows, k_max=self.k_max, max_num_seqs=self.max_num_seqs)
        if self.full_speed is not None:
            check_full_speed(schedule, self.full_speed)
        now = self.clock.wall()
        if update.version == self.version and self.last_put and schedule != self.last_put:
            raise StaleVersionError(f"version: {update.version} was already applied with a different schedule")
        self.schedule = schedule
        self.last_put = schedule
        self.version = update.version
        self.applied_at = now
        self.lease_expires_at = now + update.lease_seconds
        self.reason = update.reason
        return self.state()

    def expire(self) -> bool:
        """Fall back to the start-up schedule if the lease ran out; True when it did just now."""
        if self.lease_expires_at is None or self.clock.wall() < self.lease_expires_at:
            return False
        self.schedule = self.fallback
        self.applied_at = self.clock.wall()
        self.lease_expires_at = None
        self.reason = "lease expired: reverted to the start-up schedule"
        self.lease_expiries += 1
        return True

    def k_for(self, batch_size: int) -> int:
        return k_for_batch(self.schedule, batch_size)

    def state(self) -> SpeculationState:
        return SpeculationState(
            worker_id=self.worker_id,
            method=self.method,
            k_max=self.k_max,
            schedule=[list(r) for r in self.schedule],
            version=self.version,
            applied_at=self.applied_at,
            lease_expires_at=self.lease_expires_at,
            fallback_schedule=[list(r) for r in self.fallback],
            reason=self.reason,
            full_speed=None if self.full_speed is None else [list(r) for r in self.full_speed],
        )
