"""Tenants changed at run time (the admin API, issue 18), and how they combine with the tenants file.

Each tenant changed at run time is one document in the store's ``tenants`` collection: a ``TenantChange``, the
tenant as the admin left it (None once deleted) and the digest of the tenants file's entry that the change was
made against (None when the file had no such tenant). Every replica re-reads the collection every
``tenants_refresh_s`` and merges it over the file with ``merge``.

Precedence, on every read (so also after a restart or a redeploy): a run-time change beats the file while the
file's entry of that tenant is still the one the change was made against. Once that entry changes — edited,
added or removed — the file wins and the change is ignored (``Provenance.superseded``): editing a tenant in the
file and redeploying is how an operator takes it back from the admin API. A change whose tier the file no longer
defines is ignored the same way.

Tiers changed at run time (their targets, priority, preference…; a tier is never created or deleted at run
time) live in the same collection, as ``TierChange`` documents under ``tier:<name>`` (a tenant id cannot hold
a ``:``), so one refresh reads both. The same precedence holds per tier: a change applies while the file's
entry of that tier is the one it was made against.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from pydantic import BaseModel, ConfigDict, ValidationError

from fleet.config import TenantConfig, TenantsConfig, TierConfig
from fleet.store.protocol import Store

log = logging.getLogger(__name__)

COLLECTION: Final = "tenants"
"""The store's document collection holding one ``TenantChange`` per tenant id (and one ``TierChange`` per tier
changed at run time, under ``tier_doc_id``)."""
TIER_DOC_PREFIX: Final = "tier:"


def tier_doc_id(tier: str) -> str:
    """The document id of tier ``tier``'s run-time change in ``COLLECTION``."""
    return TIER_DOC_PREFIX + tier


def entry_digest(tenant: TenantConfig | TierConfig | None) -> str | None:
    """Digest of a tenants-file entry, tenant or tier (every field, a tenant's keys' digests included); None for
    no entry."""
    if tenant is None:
        return None
    text = json.dumps(tenant.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class TenantChange(BaseModel):
    """One tenant as changed at run time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant_id: str
    tenant: TenantConfig | None
    """The tenant as the admin left it, without keys (a file tenant keeps the file's keys); None: deleted."""
    file_digest: str | None
    """``entry_digest`` of the file's entry when the change was made; None when the file had none."""
    changed_at: float
    """Unix seconds."""
    changed_by: str
    """The id of the admin key that made the change."""
    version: int = 0
    """1 for the tenant's first run-time change, one more for each later one (the admin API's ETag; a change written
    before versions existed reads as 0). The store checks it when writing (``Store.put_doc_logged``), so of two
    editors of the same version only the first succeeds."""


class TierChange(BaseModel):
    """One tier as changed at run time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tier_name: str
    tier: TierConfig
    file_digest: str | None
    """``entry_digest`` of the file's tier when the change was made."""
    changed_at: float
    """Unix seconds."""
    changed_by: str
    """The id of the admin key that made the change."""
    version: int = 0
    """As ``TenantChange.version``: 1 for the tier's first run-time change, one more for each later one."""


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a tenant's effective definition comes from."""

    in_file: bool
    change: TenantChange | TierChange | None
    """The run-time change stored for this tenant (or tier), applied or not."""
    applied: bool
    """The change is in force (False: no change, or the file's entry changed since: ``superseded``)."""

    @property
    def superseded(self) -> bool:
        return self.change is not None and not self.applied


@dataclass(frozen=True, slots=True)
class Merged:
    """The tenants in force: the file with the run-time changes that still apply."""

    tenants: TenantsConfig
    provenance: dict[str, Provenance]
    """Every tenant id in the file or with a stored change."""
    tier_provenance: dict[str, Provenance]
    """Every tier of the file."""


def parse_changes(docs: Mapping[str, str]) -> dict[str, TenantChange]:
    """The collection's documents as changes; an unreadable one is logged and left out."""
    out: dict[str, TenantChange] = {}
    for doc_id, body in docs.items():
        if doc_id.startswith(TIER_DOC_PREFIX):
            continue
        try:
            out[doc_id] = TenantChange.model_validate_json(body)
        except ValidationError as exc:
            log.warning("ignoring run-time tenant %r: %s", doc_id, exc)
    return out


def parse_tier_changes(docs: Mapping[str, str]) -> dict[str, TierChange]:
    """The collection's tier documents as changes, by tier name; an unreadable one is logged and left out."""
    out: dict[str, TierChange] = {}
    for doc_id, body in docs.items():
        if not doc_id.startswith(TIER_DOC_PREFIX):
            continue
        try:
            change = TierChange.model_validate_json(body)
        except ValidationError as exc:
            log.warning("ignoring run-time tier %r: %s", doc_id, exc)
            continue
        out[change.tier_name] = change
    return out


def merge_tiers(
    file: TenantsConfig, changes: Mapping[str, TierChange]
) -> tuple[dict[str, TierConfig], dict[str, Provenance]]:
    """The file's tiers with each change applied whose ``file_digest`` matches the file's tier today; a change to a
    tier the file no longer defines is ignored."""
    tiers = dict(file.tiers)
    provenance = {name: Provenance(in_file=True, change=None, applied=False) for name in file.tiers}
    for name, change in sorted(changes.items()):
        if name not in file.tiers:
            continue
        applies = change.file_digest == entry_digest(file.tiers[name])
        provenance[name] = Provenance(in_file=True, change=change, applied=applies)
        if applies:
            tiers[name] = change.tier
    return tiers, provenance


def merge(
    file: TenantsConfig, changes: Mapping[str, TenantChange], tier_changes: Mapping[str, TierChange] | None = None
) -> Merged:
    """Apply each change whose ``file_digest`` matches the file's entry today and whose tier the file defines
    (``merge_tiers`` for the tiers)."""
    tiers, tier_provenance = merge_tiers(file, tier_changes or {})
    in_force: dict[str, TenantConfig] = {t.id: t for t in file.tenants}
    provenance = {t.id: Provenance(in_file=True, change=None, applied=False) for t in file.tenants}
    for tenant_id, change in sorted(changes.items()):
        entry = next((t for t in file.tenants if t.id == tenant_id), None)
        applies = change.file_digest == entry_digest(entry) and (
            change.tenant is None or change.tenant.tier in file.tiers
        )
        provenance[tenant_id] = Provenance(in_file=entry is not None, change=change, applied=applies)
        if not applies:
            continue
        if change.tenant is None:
            in_force.pop(tenant_id, None)
        else:
            in_force[tenant_id] = change.tenant.model_copy(update={"keys": entry.keys if entry else ()})
    tenants = TenantsConfig(tiers=tiers, tenants=tuple(in_force.values()))
    return Merged(tenants=tenants, provenance=provenance, tier_provenance=tier_provenance)


def merge_docs(file: TenantsConfig, docs: Mapping[str, str]) -> Merged:
    """``merge`` of the collection's documents, tenants and tiers, over ``file``."""
    return merge(file, parse_changes(docs), parse_tier_changes(docs))


async def read_merged(file: TenantsConfig, store: Store) -> Merged:
    """The tenants in force now: ``file`` merged (``merge``) with the changes stored in ``store``. For readers that
    keep no copy of the documents (the controller once per tick, ``gearshift top`` per frame)."""
    return merge_docs(file, await store.docs(COLLECTION))
