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

Before the spool, every usage record goes to the journal (``Journal``, ``<dir>/journal.<n>.jsonl``) while the
request is still answering: the client sees ``[DONE]`` (or the JSON answer) only once its record is on disk, and the
journal forgets it when the store or the spool has it. A kill between the two leaves it to the next process.
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


JOURNAL_SEGMENT_BYTES = 4 * 1024 * 1024
"""A journal segment still holding records the store lacks is closed past this size and a new one begun, so the
journal stays bounded under load that never lets the writer catch up completely."""


class _Segment:
    """One journal file: ``count`` records in it not yet in the store or the outage spool."""

    __slots__ = ("count", "fd", "path", "size")

    def __init__(self, path: Path, *, count: int = 0, size: int = 0, fd: int | None = None) -> None:
        self.path, self.count, self.size, self.fd = path, count, size, fd


class Journal:
    """The write-ahead journal of usage records, ``<directory>/journal.<n>.jsonl``: a record is appended (one
    ``write(2)``, ``append``) before the client sees the end of its answer, and forgotten (``done``) once the
    background writer has it in the store or in the outage spool (``Spool``), in the order it was appended. The next
    process on the directory takes what a killed one left (``recovered``) and writes it again (a record the store
    already had is skipped by its request id, ``Store.append_usage_many``).

    Durability: without ``fsync`` a record is in the kernel's page cache when ``append`` returns, which survives
    the process (SIGKILL, OOM kill, a crash) but not the host (a power cut, a kernel panic: what the kernel had not
    yet written back, typically the last few seconds, is lost). ``fsync`` (``GEARSHIFT_LEDGER_JOURNAL_FSYNC``) adds
    an ``fsync`` per record: it survives the host too, at the disk's flush latency on every answer.

    Cost per record: one JSON encoding and one ``write(2)``; when the writer has caught up with everything, one
    ``ftruncate(2)`` empties the file (shared by every record written meanwhile). A segment past
    ``segment_bytes`` while records are still outstanding is left to drain and a new one begun."""

    def __init__(self, directory: Path, *, fsync: bool = False, segment_bytes: int = JOURNAL_SEGMENT_BYTES) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._dir = directory
        self._lock = _lock(directory / "journal.lock")
        self._fsync = fsync
        self._segment_bytes = segment_bytes
        self._segments: list[_Segment] = []
        self._recovered: list[UsageRecord] = []
        numbers = sorted(int(p.name.split(".")[1]) for p in directory.glob("journal.*.jsonl") if _numbered(p))
        for n in numbers:
            path = self._path(n)
            records = self._read(path)
            if records:
                self._segments.append(_Segment(path, count=len(records), size=path.stat().st_size))
                self._recovered += records
            else:
                path.unlink()
        self._next = (numbers[-1] + 1) if numbers else 0
        self._open_segment()
        if self._recovered:
            log.warning("usage journal %s: %d records a previous process left, written again (a record the store "
                        "already has is skipped)", directory, len(self._recovered))  # fmt: skip

    def recovered(self) -> list[UsageRecord]:
        """The records a previous process journaled and did not see stored, oldest first: the caller writes them
        (before any new record) and calls ``done`` for them like for the others. Given once."""
        records, self._recovered = self._recovered, []
        return records

    def append(self, record: UsageRecord) -> None:
        """Journal ``record`` (see the class docstring for what survives what). A failed write (a full disk) is
        logged, and the record is then only in memory, as without a journal."""
        current = self._segments[-1]
        if current.size >= self._segment_bytes and current.count:
            current = self._open_segment()
        current.count += 1
        data = record.model_dump_json().encode() + b"\n"
        assert current.fd is not None
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(current.fd, view) :]
            if self._fsync:
                os.fsync(current.fd)
        except OSError as exc:
            log.error("usage journal %s: record %s not journaled: %s", current.path, record.request_id, exc)
        current.size += len(data)

    def done(self, n: int) -> None:
        """The oldest ``n`` outstanding records are in the store or the outage spool: forget them."""
        while n > 0 and self._segments:
            first = self._segments[0]
            taken = min(n, first.count)
            first.count -= taken
            n -= taken
            if first.count:
                break
            if first is self._segments[-1]:  # everything journaled is elsewhere: empty the file
                if first.size:
                    assert first.fd is not None
                    os.ftruncate(first.fd, 0)
                    first.size = 0
                break
            self._segments.pop(0)
            if first.fd is not None:
                os.close(first.fd)
            first.path.unlink(missing_ok=True)

    def outstanding(self) -> int:
        """Records journaled and not yet ``done``."""
        return sum(s.count for s in self._segments)

    def clear(self) -> None:
        """Everything journaled is elsewhere (the shutdown spooled what was left): forget it all."""
        self.done(self.outstanding())

    def close(self) -> None:
        for segment in self._segments:
            if segment.fd is not None:
                os.close(segment.fd)
                segment.fd = None
        os.close(self._lock)

    # files -----------------------------------------------------------------------------------------------
    def _path(self, n: int) -> Path:
        return self._dir / f"journal.{n}.jsonl"

    def _open_segment(self) -> _Segment:
        path = self._path(self._next)
        self._next += 1
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        if self._fsync:
            dir_fd = os.open(self._dir, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        segment = _Segment(path, fd=fd)
        self._segments.append(segment)
        return segment

    @staticmethod
    def _read(path: Path) -> list[UsageRecord]:
        """The whole records in ``path``; a line torn by a kill mid-write (never followed by the end of its
        answer) and a damaged line are dropped."""
        records = []
        for line in path.read_bytes().split(b"\n")[:-1]:
            try:
                records.append(UsageRecord.model_validate_json(line))
            except ValidationError:
                log.error("usage journal %s: skipping an unreadable record", path)
        return records


def _numbered(path: Path) -> bool:
    parts = path.name.split(".")
    return len(parts) == 3 and parts[1].isdigit()
