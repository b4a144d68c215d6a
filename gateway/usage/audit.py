"""The admin audit trail: every change made through the admin API, appended to the store's ``admin-audit`` log
(who: the admin key's id; what: the action, its target and its details; when), read by ``GET /admin/v1/audit``.

A run-time tenant or tier change is stored with its entry in one write (``entry`` here, then
``gateway.intake.tenant_book``'s ``Store.put_doc_logged``): the log lives in the tenants collection's slot
(``fleet.store.keys.LOG_SLOTS``), so a change is never stored without its entry nor an entry without its change.
Every other action (keys, brownout, budget reset) changes no document and is appended alone (``record``)."""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel, ConfigDict

from fleet.store.protocol import Store

LOG: Final = "admin-audit"


class AuditEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    at: float
    """Unix seconds."""
    who: str
    """The id of the admin key that made the change."""
    action: str
    """``tenant.create``, ``tenant.update``, ``tenant.delete``, ``tenant.budget_reset``, ``tier.update``,
    ``key.create``, ``key.revoke`` or ``brownout.set``."""
    target: str
    """The tenant, key or switch changed."""
    details: dict[str, Any] = {}


def entry(*, who: str, action: str, target: str, now: float, **details: Any) -> str:
    """The JSON text of one entry (for a write that stores it with its change)."""
    return AuditEntry(at=now, who=who, action=action, target=target, details=details).model_dump_json()


async def record(store: Store, *, who: str, action: str, target: str, now: float, **details: Any) -> None:
    """Append one entry on its own (an action that changes no run-time tenant or tier)."""
    await store.append_log(LOG, entry(who=who, action=action, target=target, now=now, **details), now=now)


async def read(store: Store, *, since: float, until: float, limit: int) -> list[AuditEntry]:
    """The entries with ``since <= at < until``, oldest first, at most ``limit``."""
    entries = await store.read_log(LOG, since=since, until=until, limit=limit)
    return [AuditEntry.model_validate_json(e.body) for e in entries]
