"""Exports of trimmed ledger records (``fleet.store.retention``): one JSON-lines file per trimmed page, one
``UsageRecord`` per line in time order (the format of ``gearshift usage export``, which ``gearshift bench replay``
reads), under ``<directory>/<tenant>/``.

A page is first written as ``….jsonl.partial`` and fsynced; it is renamed to ``….jsonl`` once the records are
trimmed from the ledger. ``recover`` settles the partial files a dead run left behind: a page whose first record
is no longer in the ledger was trimmed (committed), one whose first record is still there was not (discarded);
a trim removes all of a page's records or none.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import quote

from fleet.store.protocol import Store, UsageRecord

PARTIAL = ".partial"


class ExportDirectory:
    """A ``retention.Sink`` writing files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    async def stage(self, tenant: str, records: Sequence[UsageRecord]) -> str:
        return str(await asyncio.to_thread(self._write, tenant, records))

    async def commit(self, handle: str) -> None:
        await asyncio.to_thread(_rename, Path(handle), Path(handle.removesuffix(PARTIAL)))

    async def discard(self, handle: str) -> None:
        await asyncio.to_thread(Path(handle).unlink, missing_ok=True)

    async def recover(self, store: Store) -> tuple[int, int]:
        """Settle partial files a dead run left behind; returns (committed, discarded)."""
        committed = discarded = 0
        for path in sorted(self.root.glob(f"*/*.jsonl{PARTIAL}")):
            first = next(_read(path), None)
            if first is None:
                path.unlink()
                continue
            near = await store.usage(
                first.tenant, since=first.at, until=math.nextafter(first.at, math.inf), limit=10_000
            )
            if any(r.request_id == first.request_id for r in near.records):
                await self.discard(str(path))
                discarded += 1
            else:
                await self.commit(str(path))
                committed += 1
        return committed, discarded

    def records(self) -> Iterator[UsageRecord]:
        """Every committed record, file by file."""
        for path in sorted(self.root.glob("*/*.jsonl")):
            yield from _read(path)

    def _write(self, tenant: str, records: Sequence[UsageRecord]) -> Path:
        folder = self.root / quote(tenant, safe="")
        folder.mkdir(parents=True, exist_ok=True)
        name = f"ledger-{records[0].at:.6f}-{records[-1].at:.6f}-{len(records)}.jsonl{PARTIAL}"
        path = folder / name
        with path.open("w", encoding="utf-8") as out:
            out.writelines(r.model_dump_json() + "\n" for r in records)
            out.flush()
            os.fsync(out.fileno())
        _fsync_dir(folder)
        return path


def _read(path: Path) -> Iterator[UsageRecord]:
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                yield UsageRecord.model_validate_json(line)


def _rename(source: Path, target: Path) -> None:
    source.replace(target)
    _fsync_dir(target.parent)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
