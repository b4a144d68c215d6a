"""The admin audit trail: every change made through the admin API, appended to the store's ``admin-audit`` log
(who: the admin key's id; what: the action, its target and its details; when), read by ``GET /admin/v1/audit``."""

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
    """``tenant.create``, ``tenant.update``, ``tenant.delete``, ``tenant.budget_reset``, ``key.create``,
    ``key.revoke`` or ``brownout.set``."""
    target: str
    """The tenant, key or switch changed."""
    details: dict[str, Any] = {}


async def record(store: Store, *, who: str, action: str, target: str, now: float, **details: Any) -> None:
    entry = AuditEntry(at=now, who=who, action=action, target=target, details=details)
    await store.append_log(LOG, entry.model_dump_json(), now=now)


async def read(store: Store, *, since: float, until: float, limit: int) -> list[AuditEntry]:
    """The entries with ``since <= at < until``, oldest first, at most ``limit``."""
    entries = await store.read_log(LOG, since=since, until=until, limit=limit)
    return [AuditEntry.model_validate_json(e.body) for e in entries]
