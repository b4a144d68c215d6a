"""The engine side of speculation control: fleet's ``SpeculationControl`` driving vLLM's dense k lookup.

This module knows nothing of vLLM's classes. ``workers.vllm.internals`` hands it the scheduler's dense
batch-size → k list (``Scheduler.dynamic_sd_lookup``) and the start-up limits; everything here runs inside
the EngineCore process, between engine steps, so no lock is needed.

The API server reaches it with one utility call whose request and reply are plain JSON-able dicts
(``{"op": "get"}`` / ``{"op": "put", "update": {...}}`` → ``{"status": 200, "state": {...}, ...}`` or
``{"status": 4xx, "error": "...", "type": "..."}``), so the wire between the processes is msgpack of
primitives and the HTTP layer maps ``status`` without knowing engine details.
"""

from __future__ import annotations

import logging
from collections.abc import MutableSequence, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from fleet.clock import Clock
from fleet.speculation import (
    FullSpeed,
    Schedule,
    ScheduleError,
    SpeculationControl,
    SpeculationUpdate,
    StaleVersionError,
    dense_lookup,
)

log = logging.getLogger("vllm.gearshift")

Reply = dict[str, Any]
"""A reply crossing the process boundary: ``status`` (HTTP code) plus ``state`` or ``error`` and ``type``."""

STATUS_OK = 200
STATUS_BAD = 400
STATUS_CONFLICT = 409
UNAVAILABLE_TYPE = "speculation_control_unavailable"
"""Error type of every reply of an engine where run-time control cannot work (HTTP 409)."""


@dataclass(frozen=True)
class EngineView:
    """What the plugin needs from a running engine, read once by ``internals``.

    ``lookup`` is the scheduler's own dense list (index = batch size, value = k), or None when the server was
    started without ``num_speculative_tokens_per_batch_size``; ``k_max`` is the start-up
    ``num_speculative_tokens`` (0 without speculation); ``method`` the speculative method or None;
    ``full_speed`` the ``(k, from_bs, to_bs)`` rows the model runner has captured decode graphs for, or None when
    no shape has a faster path (eager, the CPU build): every gear alike.
    """

    lookup: MutableSequence[int] | None
    k_max: int
    max_num_seqs: int
    method: str | None
    full_speed: FullSpeed | None = None


class EngineSideMissing(RuntimeError):
    """The EngineCore process has no gearshift method: the general plugin was not loaded there."""


def schedule_from_dense(lookup: Sequence[int]) -> Schedule:
    """Compress a dense lookup (index 0 unused) into schedule rows ``(from_bs, to_bs, k)``."""
    rows: list[tuple[int, int, int]] = []
    for bs in range(1, len(lookup)):
        k = lookup[bs]
        if rows and rows[-1][2] == k:
            rows[-1] = (rows[-1][0], bs, k)
        else:
            rows.append((bs, bs, k))
    return tuple(rows)


def error_reply(status: int, kind: str, message: str, *, param: str | None = None) -> Reply:
    """An error reply; ``kind`` is machine-readable, ``param`` the request field at fault, if one is."""
    reply: Reply = {"status": status, "type": kind, "error": message}
    if param is not None:
        reply["param"] = param
    return reply


def unavailable_reason(view: EngineView) -> str | None:
    """Why run-time control cannot work on this engine, or None when it can."""
    if view.method is None or view.k_max <= 0:
        return (
            "speculation control is unavailable: this vLLM server runs without speculative decoding; start it "
            "with --speculative-config including num_speculative_tokens and num_speculative_tokens_per_batch_size"
        )
    if view.lookup is None:
        return (
            "speculation control is unavailable: this vLLM server was started without a per-batch-size table; "
            "add num_speculative_tokens_per_batch_size (e.g. [[1, max_num_seqs, k_max]]) to --speculative-config "
            "(vLLM also drops the table when data_parallel_size > 1)"
        )
    return None


class _NoClock:
    """Clock of a disabled instance, which never reads time."""

    def wall(self) -> float:
        raise AssertionError("a disabled EngineSpeculation reads no clock")

    def monotonic(self) -> float:
        raise AssertionError("a disabled EngineSpeculation reads no clock")

    async def sleep(self, seconds: float) -> None:
        raise AssertionError("a disabled EngineSpeculation reads no clock")


class EngineSpeculation:
    """Versioned, leased schedule applied to the engine's dense lookup (DESIGN §3.1, §7)."""

    def __init__(self, view: EngineView, *, worker_id: str, clock: Clock, disabled_reason: str | None = None) -> None:
        self._view = view
        self._reason = disabled_reason or unavailable_reason(view)
        self._control: SpeculationControl | None = None
        if self._reason is not None:
            log.error("gearshift: %s", self._reason)
            return
        assert view.lookup is not None
        self._lookup = view.lookup
        self._control = SpeculationControl(
            worker_id=worker_id,
            method=view.method or "",
            k_max=view.k_max,
            max_num_seqs=view.max_num_seqs,
            fallback=schedule_from_dense(view.lookup),
            clock=clock,
            full_speed=view.full_speed,
        )
        log.info("gearshift: speculation control ready, start-up schedule %s", self._control.fallback)

    @classmethod
    def disabled(cls, view: EngineView, reason: str) -> EngineSpeculation:
        """An instance that refuses every call with ``reason`` (HTTP 409) and never touches the engine."""
        return cls(view, worker_id="-", clock=_NoClock(), disabled_reason=reason)

    @property
    def available(self) -> bool:
        return self._control is not None

    def before_step(self) -> None:
        """Called before every engine step: revert to the start-up schedule once the lease runs out."""
        if self._control is not None and self._control.expire():
            self._write_lookup()
            log.warning("gearshift: lease expired, reverted to the start-up schedule %s", self._control.schedule)

    def handle(self, request: dict[str, Any]) -> Reply:
        """Serve one utility call from the API server; never raises."""
        if self._control is None:
            return error_reply(STATUS_CONFLICT, UNAVAILABLE_TYPE, self._reason or "unavailable")
        op = request.get("op")
        if op == "get":
            self.before_step()
            return self._ok()
        if op == "put":
            return self._put(request.get("update"))
        return error_reply(STATUS_BAD, "invalid_request", f"op: unknown operation {op!r}; expected 'get' or 'put'")

    def _put(self, body: Any) -> Reply:
        assert self._control is not None
        self.before_step()
        try:
            update = SpeculationUpdate.model_validate(body)
            self._control.apply(update)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "body"
            return error_reply(STATUS_BAD, "invalid_request", f"{field}: {first['msg']}", param=field)
        except StaleVersionError as exc:
            return error_reply(STATUS_CONFLICT, "stale_version", str(exc))
        except ScheduleError as exc:
            return error_reply(STATUS_BAD, "invalid_schedule", str(exc))
        self._write_lookup()
        log.info(
            "gearshift: applied schedule %s (version %d, reason %r)",
            self._control.schedule,
            self._control.version,
            self._control.reason,
        )
        return self._ok()

    def _write_lookup(self) -> None:
        """Rewrite the scheduler's list in place: the next ``schedule()`` call reads the new k."""
        assert self._control is not None
        dense = dense_lookup(self._control.schedule, max_num_seqs=len(self._lookup) - 1)
        dense[0] = 0  # vLLM never reads index 0; keep it as vLLM built it
        self._lookup[:] = [min(k, self._view.k_max) for k in dense]

    def _ok(self) -> Reply:
        assert self._control is not None
        return {
            "status": STATUS_OK,
            "state": self._control.state().model_dump(mode="json"),
            "lease_expiries": self._control.lease_expiries,
        }
