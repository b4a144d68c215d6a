"""What the console reads, each through the admin API's own functions (the ones ``/admin/v1`` serves and the
CLI calls over HTTP) or the store readers the CLI uses: one code path for every figure the console shows."""

from __future__ import annotations

from collections import deque
from typing import Any

from fleet.plan import FleetPlan, read_plans
from fleet.store.protocol import UsageRecord
from gateway.http import admin, tenants_admin
from gateway.usage.audit import AuditEntry
from gateway.wiring import Gateway

LEDGER_PAGE = 1000
LEDGER_PAGES = 20
"""A window's ledger is read at most this many pages deep (the console shows recent figures, not history)."""


async def ledger_since(gw: Gateway, who: str, *, since: float) -> list[UsageRecord]:
    """The ledger's records from ``since`` (Unix s) on, through ``GET /admin/v1/ledger``, without repeats."""
    seen: dict[str, UsageRecord] = {}
    cursor = since
    for _ in range(LEDGER_PAGES):
        page = await admin.ledger(who, gw, since=cursor, until=None, limit=LEDGER_PAGE)
        for row in page["data"]:
            record = UsageRecord.model_validate(row)
            seen[record.request_id] = record
        if page["next_since"] is None:
            break
        cursor = page["next_since"]
    return list(seen.values())


async def workers(gw: Gateway, who: str) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = (await admin.workers(who, gw))["data"]
    return data


async def plans(gw: Gateway) -> dict[str, FleetPlan]:
    """The fleet plans in the store (``gearshift controller explain`` reads them the same way)."""
    return await read_plans(gw.store)


async def recent_audit(
    gw: Gateway, who: str, *, since: float, shown: int, target: str | None = None
) -> list[AuditEntry]:
    """The newest ``shown`` audit entries since ``since`` (about ``target`` only, when given), newest first,
    through ``GET /admin/v1/audit`` a page at a time (at most ``LEDGER_PAGES`` pages)."""
    newest: deque[AuditEntry] = deque(maxlen=shown)
    seen: set[str] = set()
    cursor = since
    for _ in range(LEDGER_PAGES):
        page = (await tenants_admin.read_audit(who, gw, since=cursor, until=None, limit=LEDGER_PAGE)).data
        for entry in page:
            key = entry.model_dump_json()  # a page starts at the last one's time: drop the repeats
            if key in seen:
                continue
            seen.add(key)
            if target is None or target in (entry.target, entry.details.get("tenant")):
                newest.append(entry)
        if len(page) < LEDGER_PAGE:
            break
        cursor = page[-1].at
    return list(reversed(newest))
