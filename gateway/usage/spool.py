"""A durable local spool for what the shared store could not take, so a metered request is never lost: usage
records (``Spool``, ``<dir>/usage.*``) and settlements (``SettlementSpool``, ``<dir>/settle.*``: TPM corrections
and slot releases; a replay is applied once, by its settle id, ``Store.settle``).

Entries go to ``<dir>/<name>.jsonl``, one JSON line each, appended and ``fsync``ed before ``append`` returns: once
it returns, a kill -9 of the gateway loses none of them. ``<dir>/<name>.offset`` holds how many bytes of the file
are already in the store (written to a temporary file, ``fsync``ed and renamed, so it is always whole). Replay reads
the records after the offset, in order; after the store has taken them, ``commit`` moves the offset, and once the
whole file is in the store both files are emptied. A crash between the store taking records and ``commit`` replays
them once more: the ledger skips request ids it already has, so each record is billed exactly once (and a
settlement's id is remembered the same way).

A line cut short by a crash in the middle of a write (no newline) was never acknowledged and is dropped. The file
is bounded by ``max_bytes``: when full, ``append`` refuses (the caller keeps the records in memory) and ``full``
is set, so the alarm and the metric can show it.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import TypeAdapter, ValidationError

from fleet.store.protocol import Settlement, UsageRecord

log = logging.getLogger(__name__)

T = TypeVar("T")


class SpoolBusy(RuntimeError):
    """Another process already uses this spool directory."""


def _lock(path: Path) -> int:
    """Hold a POSIX lock on ``path`` (the returned descriptor) until ``close`` or the process dies (the kernel
    drops it then, even on kill -9): a second process on the same spool is refused, the same process may reopen
    it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise SpoolBusy(
            f"{path.parent} is the spool of another running gateway: give each replica its own GEARSHIFT_SPOOL_DIR"
        ) from None
    return fd


class JsonlSpool(Generic[T]):
    """The spool ``name`` in ``directory`` (created if missing), entries written by ``encode`` (one line of JSON,
    without its newline) and read by ``decode``. Not safe for two processes at once: one per replica."""

    def __init__(
        self,
        directory: Path,
        *,
        name: str,
        encode: Callable[[T], bytes],
        decode: Callable[[bytes], T],
        max_bytes: int,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._lock = _lock(directory / f"{name}.lock")
        self._data = directory / f"{name}.jsonl"
        self._offset_path = directory / f"{name}.offset"
        self._encode, self._decode = encode, decode
        self._max_bytes = max_bytes
        self.full = False
        """True since an ``append`` was refused for lack of room, until the spool drains below its bound."""
        self._data.touch(exist_ok=True)
        self._offset = min(self._read_offset(), self._drop_torn_tail())

    # writing ---------------------------------------------------------------------------------------------
    def append(self, records: Sequence[T]) -> bool:
        """Durably add ``records`` (in order); False, with nothing written, when they would pass ``max_bytes``."""
        if not records:
            return True
        data = b"".join(self._encode(r) + b"\n" for r in records)
        if self.size_bytes() + len(data) > self._max_bytes:
            self.full = True
            return False
        with self._data.open("ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return True

    # replaying -------------------------------------------------------------------------------------------
    def pending(self, limit: int) -> tuple[list[T], int]:
        """Up to ``limit`` records not yet in the store, oldest first, and the file offset just after them
        (to pass to ``commit`` once the store has them)."""
        records: list[T] = []
        end = self._offset
        with self._data.open("rb") as f:
            f.seek(self._offset)
            while len(records) < limit:
                line = f.readline()
                if not line.endswith(b"\n"):
                    break
                end += len(line)
                try:
                    records.append(self._decode(line))
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

    def close(self) -> None:
        """Let another process take the spool (what is pending stays for it)."""
        os.close(self._lock)

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


class Spool(JsonlSpool[UsageRecord]):
    """The usage-record spool, ``<directory>/usage.jsonl``."""

    def __init__(self, directory: Path, *, max_bytes: int) -> None:
        super().__init__(
            directory,
            name="usage",
            encode=lambda r: r.model_dump_json().encode(),
            decode=UsageRecord.model_validate_json,
            max_bytes=max_bytes,
        )


_SETTLEMENT = TypeAdapter(Settlement)


class SettlementSpool(JsonlSpool[Settlement]):
    """The settlement spool, ``<directory>/settle.jsonl``."""

    def __init__(self, directory: Path, *, max_bytes: int) -> None:
        super().__init__(
            directory,
            name="settle",
            encode=_SETTLEMENT.dump_json,
            decode=_SETTLEMENT.validate_json,
            max_bytes=max_bytes,
        )
