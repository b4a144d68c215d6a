"""A durable local spool for usage records the shared store could not take, so a metered request is never lost.

Records go to ``<dir>/usage.jsonl``, one JSON line each, appended and ``fsync``ed before ``append`` returns: once
it returns, a kill -9 of the gateway loses none of them. ``<dir>/usage.offset`` holds how many bytes of the file
are already in the store (written to a temporary file, ``fsync``ed and renamed, so it is always whole). Replay reads
the records after the offset, in order; after the store has taken them, ``commit`` moves the offset, and once the
whole file is in the store both files are emptied. A crash between the store taking records and ``commit`` replays
them once more: the ledger skips request ids it already has, so each record is billed exactly once.

A line cut short by a crash in the middle of a write (no newline) was never acknowledged and is dropped. The file
is bounded by ``max_bytes``: when full, ``append`` refuses (the caller keeps the records in memory) and ``full``
is set, so the alarm and the metric can show it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from fleet.store.protocol import UsageRecord

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 256 * 1024 * 1024


class Spool:
    """The spool in ``directory`` (created if missing). Not safe for two processes at once: one per replica."""

    def __init__(self, directory: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._data = directory / "usage.jsonl"
        self._offset_path = directory / "usage.offset"
        self._max_bytes = max_bytes
        self.full = False
        """True since an ``append`` was refused for lack of room, until the spool drains below its bound."""
        self._data.touch(exist_ok=True)
        self._offset = min(self._read_offset(), self._drop_torn_tail())

    # writing ---------------------------------------------------------------------------------------------
    def append(self, records: Sequence[UsageRecord]) -> bool:
        """Durably add ``records`` (in order); False, with nothing written, when they would pass ``max_bytes``."""
        if not records:
            return True
        data = b"".join(r.model_dump_json().encode() + b"\n" for r in records)
        if self.size_bytes() + len(data) > self._max_bytes:
            self.full = True
            return False
        with self._data.open("ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return True

    # replaying -------------------------------------------------------------------------------------------
    def pending(self, limit: int) -> tuple[list[UsageRecord], int]:
        """Up to ``limit`` records not yet in the store, oldest first, and the file offset just after them
        (to pass to ``commit`` once the store has them)."""
        records: list[UsageRecord] = []
        end = self._offset
        with self._data.open("rb") as f:
            f.seek(self._offset)
            while len(records) < limit:
                line = f.readline()
                if not line.endswith(b"\n"):
                    break
                end += len(line)
                try:
                    records.append(UsageRecord.model_validate_json(line))
                except ValidationError:  # a damaged line must not stop the replay of the others
                    log.error("usage spool %s: skipping an unreadable record at byte %d", self._data, end - len(line))
        return records, end

    def commit(self, end: int) -> None:
        """The store has every record before file offset ``end``; empty the spool once it has them all."""
        if end >= self._data.stat().st_size:
            self._write_offset(0)
            with self._data.open("r+b") as f:
                f.truncate(0)
                os.fsync(f.fileno())
            end = 0
        else:
            self._write_offset(end)
        self._offset = end
        if self.size_bytes() < self._max_bytes // 2:
            self.full = False

    def size_bytes(self) -> int:
        """Bytes of records not yet in the store (plus, until it drains, those already replayed)."""
        return self._data.stat().st_size

    def has_pending(self) -> bool:
        return self._data.stat().st_size > self._offset

    # files -----------------------------------------------------------------------------------------------
    def _read_offset(self) -> int:
        try:
            return int(self._offset_path.read_text() or "0")
        except (FileNotFoundError, ValueError):
            return 0

    def _write_offset(self, offset: int) -> None:
        tmp = self._offset_path.with_suffix(".tmp")
        with tmp.open("w") as f:
            f.write(str(offset))
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self._offset_path)

    def _drop_torn_tail(self) -> int:
        """Cut a last line left without its newline by a crash mid-write; return the file's size after."""
        with self._data.open("r+b") as f:
            data = f.read()
            whole = data.rfind(b"\n") + 1
            if whole < len(data):
                f.truncate(whole)
                os.fsync(f.fileno())
        return whole
