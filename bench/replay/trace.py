"""Request traces as a lab input: the gateway's own ledger export, the public LLM-serving trace layouts, and a
plain CSV/JSONL with named columns, all read into one ``Trace`` of ``TraceRequest``.

Formats, detected from the file (``detect``):

- ``ledger``: JSON lines as ``gearshift usage export`` writes them (``fleet.store.protocol.UsageRecord``):
  ``arrived_at`` (Unix s), ``prompt_tokens``, ``completion_tokens``, ``tenant``, ``tier``, ``workload``,
  ``session``. Records without output tokens (refused or failed before the first token) are left out and
  counted.
- ``azure``: the Azure LLM inference traces (2023, 2024): CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``,
  timestamps as ``YYYY-MM-DD HH:MM:SS.fffffff``.
- ``burstgpt``: BurstGPT's CSV ``Timestamp,Model,Request tokens,Response tokens,…`` (seconds).
- ``mooncake``: Mooncake's JSON lines ``timestamp`` (ms), ``input_length``, ``output_length``.
- ``plain``: CSV or JSON lines with named columns: an arrival (``arrival_s``, ``timestamp`` or ``arrived_at``:
  seconds or an ISO date-time), ``prompt_tokens`` (or ``input_tokens``), ``output_tokens`` (or
  ``completion_tokens``), and optionally ``tenant``, ``tier``, ``workload``, ``session``.

A bad row raises ``TraceError`` naming the file, the line and the field. Arrival times are rebased to 0 and
divided by ``speed``; a trace longer than ``max_duration_s`` is cut there, and the trace says how much was cut.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

Format = Literal["ledger", "azure", "burstgpt", "mooncake", "plain"]
FORMATS: tuple[Format, ...] = ("ledger", "azure", "burstgpt", "mooncake", "plain")

ARRIVAL_FIELDS = ("arrival_s", "timestamp", "arrived_at")
PROMPT_FIELDS = ("prompt_tokens", "input_tokens")
OUTPUT_FIELDS = ("output_tokens", "completion_tokens")


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, the line and the field."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One recorded request: when it arrived (seconds from the trace's start) and its lengths (tokens)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    tenant: str = "default"
    tier: str | None = None
    workload: str | None = None
    """The request's workload hint (an acceptance class of the profile), when it had one."""
    session: str | None = None
    """Requests of one session are turns: each waits for the previous one's answer (closed loop)."""
    worker_id: str | None = None
    """The worker that served it in the recorded run (ledger traces)."""
    finish_s: float | None = None
    """When it finished in the recorded run (seconds, same clock as ``arrival_s``), when known: a session's
    think time is the gap from one turn's finish to the next turn's arrival."""


@dataclass(frozen=True, slots=True)
class Trace:
    source: str
    format: Format
    requests: tuple[TraceRequest, ...]
    """In arrival order, the first at 0."""
    left_out: int = 0
    """Rows without output tokens (ledger records of refused or failed requests)."""
    cut: int = 0
    """Requests past ``max_duration_s``, not replayed."""
    speed: float = 1.0
    notes: tuple[str, ...] = field(default=())

    @property
    def duration_s(self) -> float:
        """From the first arrival to the last, seconds (after rebasing and speed-up)."""
        return self.requests[-1].arrival_s if self.requests else 0.0


# ------------------------------------------------------------------------------------------------ parsing
def _number(value: Any, where: str, name: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise TraceError(f"{where}: {name}: not a number: {value!r}") from None
    if not math.isfinite(out):
        raise TraceError(f"{where}: {name}: not a finite number: {value!r}")
    return out


def _count(value: Any, where: str, name: str) -> int:
    out = _number(value, where, name)
    if out < 0 or out != int(out):
        raise TraceError(f"{where}: {name}: not a token count (a whole number ≥ 0): {value!r}")
    return int(out)


def _time(value: Any, where: str, name: str) -> float:
    """Seconds, from a number or an ISO date-time (naive ones are UTC); 7-digit fractions are cut to 6."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _number(value, where, name)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    head, dot, frac = text.partition(".")
    if dot:
        digits = "".join(c for c in frac if c.isdigit())
        text = f"{head}.{digits[:6]}{frac[len(digits) :]}"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise TraceError(f"{where}: {name}: neither seconds nor an ISO date-time: {value!r}") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _pick(row: Mapping[str, Any], names: tuple[str, ...], where: str) -> tuple[str, Any]:
    for name in names:
        if row.get(name) not in (None, ""):
            return name, row[name]
    raise TraceError(f"{where}: {names[0]}: missing (one of {list(names)} is required)")


def _text(row: Mapping[str, Any], name: str) -> str | None:
    value = row.get(name)
    return None if value in (None, "") else str(value)


Reader = Callable[[Mapping[str, Any], str], TraceRequest | None]
"""One row (and where it is, ``file:line``) → a request at its absolute arrival time, or None to leave out."""


def _ledger_row(row: Mapping[str, Any], where: str) -> TraceRequest | None:
    output = _count(_pick(row, ("completion_tokens",), where)[1], where, "completion_tokens")
    if output == 0:
        return None
    return TraceRequest(
        arrival_s=_time(_pick(row, ("arrived_at",), where)[1], where, "arrived_at"),
        prompt_tokens=max(1, _count(_pick(row, ("prompt_tokens",), where)[1], where, "prompt_tokens")),
        output_tokens=output,
        tenant=_text(row, "tenant") or "default",
        tier=_text(row, "tier"),
        workload=_text(row, "workload"),
        session=_text(row, "session"),
        worker_id=_text(row, "worker_id"),
        finish_s=_time(row["at"], where, "at") if row.get("at") not in (None, "") else None,
    )


def _plain_row(row: Mapping[str, Any], where: str) -> TraceRequest | None:
    arrival_name, arrival = _pick(row, ARRIVAL_FIELDS, where)
    prompt_name, prompt = _pick(row, PROMPT_FIELDS, where)
    output_name, output = _pick(row, OUTPUT_FIELDS, where)
    return TraceRequest(
        arrival_s=_time(arrival, where, arrival_name),
        prompt_tokens=max(1, _count(prompt, where, prompt_name)),
        output_tokens=max(1, _count(output, where, output_name)),
        tenant=_text(row, "tenant") or "default",
        tier=_text(row, "tier"),
        workload=_text(row, "workload"),
        session=_text(row, "session"),
    )


def _azure_row(row: Mapping[str, Any], where: str) -> TraceRequest | None:
    return TraceRequest(
        arrival_s=_time(_pick(row, ("TIMESTAMP",), where)[1], where, "TIMESTAMP"),
        prompt_tokens=max(1, _count(_pick(row, ("ContextTokens",), where)[1], where, "ContextTokens")),
        output_tokens=max(1, _count(_pick(row, ("GeneratedTokens",), where)[1], where, "GeneratedTokens")),
    )


def _burstgpt_row(row: Mapping[str, Any], where: str) -> TraceRequest | None:
    output = _count(_pick(row, ("Response tokens",), where)[1], where, "Response tokens")
    if output == 0:  # BurstGPT logs failed requests with 0 response tokens
        return None
    return TraceRequest(
        arrival_s=_time(_pick(row, ("Timestamp",), where)[1], where, "Timestamp"),
        prompt_tokens=max(1, _count(_pick(row, ("Request tokens",), where)[1], where, "Request tokens")),
        output_tokens=output,
        workload=None,
    )


def _mooncake_row(row: Mapping[str, Any], where: str) -> TraceRequest | None:
    return TraceRequest(
        arrival_s=_number(_pick(row, ("timestamp",), where)[1], where, "timestamp") / 1000.0,
        prompt_tokens=max(1, _count(_pick(row, ("input_length",), where)[1], where, "input_length")),
        output_tokens=max(1, _count(_pick(row, ("output_length",), where)[1], where, "output_length")),
    )


READERS: dict[Format, Reader] = {
    "ledger": _ledger_row,
    "azure": _azure_row,
    "burstgpt": _burstgpt_row,
    "mooncake": _mooncake_row,
    "plain": _plain_row,
}


def _json_rows(path: Path) -> Iterator[tuple[int, Mapping[str, Any]]]:
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{path}:{line_no}: not a JSON object: {exc.msg}") from None
            if not isinstance(row, dict):
                raise TraceError(f"{path}:{line_no}: not a JSON object")
            yield line_no, row


def _csv_rows(path: Path) -> Iterator[tuple[int, Mapping[str, Any]]]:
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        for row in reader:
            yield reader.line_num, {k.strip(): v for k, v in row.items() if k is not None}


def _is_json(path: Path) -> bool:
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                return line.lstrip().startswith("{")
    return False


def detect(path: Path) -> Format:
    """The file's format, from its first row's fields."""
    if _is_json(path):
        first = next((row for _, row in _json_rows(path)), {})
        if "completion_tokens" in first and "request_id" in first:
            return "ledger"
        if {"timestamp", "input_length", "output_length"} <= set(first):
            return "mooncake"
        return "plain"
    with path.open(encoding="utf-8", newline="") as f:
        header = {h.strip() for h in next(csv.reader(f), [])}
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= header:
        return "azure"
    if {"Timestamp", "Request tokens", "Response tokens"} <= header:
        return "burstgpt"
    return "plain"


def _rows(path: Path, fmt: Format) -> Iterator[tuple[int, Mapping[str, Any]]]:
    if fmt in ("ledger", "mooncake") or (fmt == "plain" and _is_json(path)):
        return _json_rows(path)
    return _csv_rows(path)


def read_trace(
    path: Path, *, fmt: Format | None = None, speed: float = 1.0, max_duration_s: float | None = None
) -> Trace:
    """Read ``path`` (format detected unless given), rebase arrivals to 0, divide them by ``speed`` and cut the
    trace at ``max_duration_s`` (seconds after rebasing and speed-up)."""
    if speed <= 0:
        raise TraceError(f"speed: must be > 0, got {speed}")
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    fmt = fmt or detect(path)
    read = READERS[fmt]
    found: list[TraceRequest] = []
    left_out = 0
    for line_no, row in _rows(path, fmt):
        request = read(row, f"{path}:{line_no}")
        if request is None:
            left_out += 1
        else:
            found.append(request)
    if not found:
        raise TraceError(f"{path}: no requests with output tokens in the trace")
    return rebase(found, source=str(path), fmt=fmt, speed=speed, max_duration_s=max_duration_s, left_out=left_out)


def rebase(
    requests: Iterable[TraceRequest],
    *,
    source: str,
    fmt: Format = "plain",
    speed: float = 1.0,
    max_duration_s: float | None = None,
    left_out: int = 0,
) -> Trace:
    """Requests at absolute times as a ``Trace``: sorted (stably) by arrival, the first at 0, sped up, cut."""
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    t0 = ordered[0].arrival_s if ordered else 0.0
    moved = [
        replace(
            r,
            arrival_s=(r.arrival_s - t0) / speed,
            finish_s=None if r.finish_s is None else (r.finish_s - t0) / speed,
        )
        for r in ordered
    ]
    kept = moved if max_duration_s is None else [r for r in moved if r.arrival_s < max_duration_s]
    return Trace(
        source=source, format=fmt, requests=tuple(kept), left_out=left_out, cut=len(moved) - len(kept), speed=speed
    )
