"""The tenants in force on this replica: the tenants file merged with the run-time changes in the store
(``fleet.tenants``). Re-read every ``tenants_refresh_s`` by a background loop, and at once after a change
made through this replica, so every replica serves a change within about one refresh."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fleet.config import TenantConfig, TenantsConfig, TierConfig
from fleet.store.keys import DocVersionConflict
from fleet.store.protocol import Store
from fleet.tenants import (
    COLLECTION,
    Merged,
    Provenance,
    TenantChange,
    TierChange,
    entry_digest,
    merge,
    merge_docs,
    tier_doc_id,
)

log = logging.getLogger(__name__)


class TenantBook:
    """The file, the changes stored at run time, and their merge; ``on_change`` gets each new set in force."""

    def __init__(self, file: TenantsConfig, store: Store, *, on_change: Callable[[TenantsConfig], None]) -> None:
        self.file = file
        self._store = store
        self._on_change = on_change
        self._docs: dict[str, str] = {}
        self.merged: Merged = merge(file, {})

    @property
    def tenants(self) -> TenantsConfig:
        return self.merged.tenants

    def tenant(self, tenant_id: str) -> TenantConfig | None:
        return self.merged.tenants.tenant(tenant_id)

    def provenance(self, tenant_id: str) -> Provenance | None:
        return self.merged.provenance.get(tenant_id)

    def tier_provenance(self, tier: str) -> Provenance | None:
        return self.merged.tier_provenance.get(tier)

    async def refresh(self) -> None:
        """Re-read the stored changes (one tick); a new set in force goes to ``on_change``."""
        docs = await self._store.docs(COLLECTION)
        if docs == self._docs:
            return
        self._docs = docs
        self.merged = merge_docs(self.file, docs)
        self._on_change(self.merged.tenants)

    async def load(self) -> None:
        """The first read, at start; a store that is away leaves the file in force until the loop's next tick."""
        try:
            await self.refresh()
        except Exception as exc:  # the loop retries; an outage must not stop the gateway from starting
            log.warning("cannot read the run-time tenants yet, serving the tenants file: %s", exc)

    def version(self, tenant_id: str) -> int:
        """The version of the tenant's stored run-time change as last read here (0: none): its ETag."""
        prov = self.provenance(tenant_id)
        return prov.change.version if prov is not None and isinstance(prov.change, TenantChange) else 0

    async def save(
        self,
        tenant_id: str,
        tenant: TenantConfig | None,
        *,
        by: str,
        now: float,
        log: str,
        entry: str,
        expect_version: int | None = None,
    ) -> int:
        """Store ``tenant`` (None: deleted) as changed at run time by admin key ``by``, against the file's entry
        as it is now, together with ``entry`` in ``log`` (the audit trail: one write, both or neither), and put it in
        force here; returns the change's version. Deleting a tenant the file does not have removes its document.

        The write is made against ``expect_version`` (the editor's; None: the version last read here) and the store
        refuses it when the stored change has another version (``DocVersionConflict``): of two editors of one
        version, on any replicas, the second is refused instead of silently undoing the first."""
        in_file = self.file.tenant(tenant_id)
        base = self.version(tenant_id) if expect_version is None else expect_version
        body = None
        if tenant is not None or in_file is not None:
            change = TenantChange(
                tenant_id=tenant_id,
                tenant=tenant.model_copy(update={"keys": ()}) if tenant is not None else None,
                file_digest=entry_digest(in_file),
                changed_at=now,
                changed_by=by,
                version=base + 1,
            )
            body = change.model_dump_json()
        try:
            await self._store.put_doc_logged(
                COLLECTION, tenant_id, body, log=log, entry=entry, now=now, expect_version=base
            )
        except DocVersionConflict:
            await self.refresh()  # the next edit here starts from the stored version
            raise
        await self.refresh()
        return base + 1

    def tier_version(self, tier: str) -> int:
        """The version of the tier's stored run-time change as last read here (0: none)."""
        prov = self.tier_provenance(tier)
        return prov.change.version if prov is not None and isinstance(prov.change, TierChange) else 0

    async def save_tier(
        self,
        tier: str,
        config: TierConfig,
        *,
        by: str,
        now: float,
        log: str,
        entry: str,
        expect_version: int | None = None,
    ) -> int:
        """Store tier ``tier`` as changed at run time by admin key ``by``, against the file's tier as it is now,
        together with ``entry`` in ``log`` (one write), and put it in force here; made against ``expect_version``
        (None: the version last read here) as ``save``'s changes are. Returns the change's version."""
        base = self.tier_version(tier) if expect_version is None else expect_version
        digest = entry_digest(self.file.tiers.get(tier))
        change = TierChange(
            tier_name=tier, tier=config, file_digest=digest, changed_at=now, changed_by=by, version=base + 1
        )
        body = change.model_dump_json()
        try:
            await self._store.put_doc_logged(
                COLLECTION, tier_doc_id(tier), body, log=log, entry=entry, now=now, expect_version=base
            )
        except DocVersionConflict:
            await self.refresh()
            raise
        await self.refresh()
        return base + 1
