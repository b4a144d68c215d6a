"""Ledger retention (issue 27): keep each tenant's usage ledger under an age and a size bound, exporting what is
trimmed first, so that the exports plus what is left are every record exactly once.

Per tenant, the cut is the later of ``now - max_age_s`` and the time of the oldest of its newest ``max_records``
records. Records older than the cut are taken a page at a time from the oldest and staged by the ``sink``
(written durably, not yet final), then removed with ``Store.trim_usage``, which removes exactly the staged
records or nothing (a record that arrived late, older than the cut, makes the count differ); the staged export
is then committed, or discarded and the page read again. A page ends before its last instant unless it is the
last one, so records at one instant are never split between an export and the ledger. A run that dies between
the trim and the commit leaves a staged export that ``ExportDirectory.recover`` commits (its records are gone
from the ledger) or discards (they are still there) on the next run.

Without a sink, records are trimmed without an export. Spend counters (budgets) are never touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fleet.store.protocol import Store, UsageRecord


class Sink(Protocol):
    """Where trimmed records go first (``fleet.store.ledger_export.ExportDirectory``)."""

    async def stage(self, tenant: str, records: Sequence[UsageRecord]) -> str:
        """Write ``records`` (one tenant's, in time order) durably as a pending export; returns its handle."""
        ...

    async def commit(self, handle: str) -> None:
        """The records are trimmed from the ledger: make the pending export final."""
        ...

    async def discard(self, handle: str) -> None:
        """The trim did not happen: drop the pending export."""
        ...


PAGE = 1000
RETRIES = 3
"""Times one page is read again when records arrived under the cut meanwhile, before the tenant is left for the
next run."""


class RetentionPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_age_s: float | None = Field(None, gt=0)
    """Records older than this are trimmed, seconds; None: no age bound."""
    max_records: int | None = Field(None, gt=0)
    """Most records kept per tenant; None: no size bound."""

    @model_validator(mode="after")
    def _some_bound(self) -> RetentionPolicy:
        if self.max_age_s is None and self.max_records is None:
            raise ValueError("set max_age_s, max_records or both")
        return self


@dataclass
class RetentionReport:
    trimmed: dict[str, int] = field(default_factory=dict)
    """Records removed (and exported, with a sink) per tenant."""
    skipped: list[str] = field(default_factory=list)
    """Tenants whose trim kept meeting late records: left for the next run."""


async def cut_for(store: Store, tenant: str, policy: RetentionPolicy, *, now: float) -> float | None:
    """The time before which ``tenant``'s records go; None when nothing does."""
    cuts = []
    if policy.max_age_s is not None:
        cuts.append(now - policy.max_age_s)
    if policy.max_records is not None:
        size_cut = await store.ledger_cutoff(tenant, keep=policy.max_records)
        if size_cut is not None:
            cuts.append(size_cut)
    return max(cuts) if cuts else None


async def retain(
    store: Store, policy: RetentionPolicy, *, now: float, sink: Sink | None = None, page: int = PAGE
) -> RetentionReport:
    """Apply ``policy`` to every tenant's ledger as of ``now`` (Unix seconds)."""
    report = RetentionReport()
    for tenant in await store.usage_tenants():
        cut = await cut_for(store, tenant, policy, now=now)
        if cut is None:
            continue
        removed = await _trim_tenant(store, tenant, cut, sink=sink, page=page)
        if removed is None:
            report.skipped.append(tenant)
        elif removed:
            report.trimmed[tenant] = removed
    return report


async def _trim_tenant(store: Store, tenant: str, cut: float, *, sink: Sink | None, page: int) -> int | None:
    total, retries, size = 0, 0, page
    while True:
        records = (await store.usage(tenant, since=float("-inf"), until=cut, limit=size)).records
        if not records:
            return total
        last_page = len(records) < size
        before = cut if last_page else records[-1].at
        batch = [r for r in records if r.at < before]
        if not batch:  # a whole page at one instant: read a larger one
            size *= 2
            continue
        handle = await sink.stage(tenant, batch) if sink is not None else None
        removed = await store.trim_usage(tenant, before=before, expected=len(batch))
        if removed is None:
            if sink is not None and handle is not None:
                await sink.discard(handle)
            retries += 1
            if retries > RETRIES:
                return None
            continue
        if sink is not None and handle is not None:
            await sink.commit(handle)
        total += removed
        size = page
        if last_page:
            return total
