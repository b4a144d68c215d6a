"""fleet.tenants: the precedence of run-time tenant changes over the tenants file."""

from __future__ import annotations

from typing import Any

from fleet.config import TenantConfig, TenantsConfig
from fleet.tenants import TenantChange, entry_digest, merge, parse_changes

KEY = {"id": "k1", "digest": "hmac-sha256:" + "0" * 64}


def file_with(**tenants: dict[str, Any]) -> TenantsConfig:
    return TenantsConfig.model_validate(
        {
            "tiers": {"gold": {}, "bronze": {}},
            "tenants": [{"id": tid, "tier": "gold", "keys": [KEY], **fields} for tid, fields in tenants.items()],
        }
    )


def tenant(config: TenantsConfig, tenant_id: str) -> TenantConfig:
    """``config``'s tenant ``tenant_id``, which the test expects to be there."""
    found = config.tenant(tenant_id)
    assert found is not None, f"no tenant {tenant_id!r}"
    return found


def change(file: TenantsConfig, tenant_id: str, fields: dict[str, Any] | None) -> TenantChange:
    """The change an admin makes to ``tenant_id`` against ``file`` (``fields`` None deletes it)."""
    tenant = TenantConfig.model_validate({"id": tenant_id, "tier": "gold", **fields}) if fields is not None else None
    return TenantChange(
        tenant_id=tenant_id,
        tenant=tenant,
        file_digest=entry_digest(file.tenant(tenant_id)),
        changed_at=1,
        changed_by="a",
    )


def test_a_change_applies_while_the_file_entry_is_the_one_it_was_made_against() -> None:
    file = file_with(acme={"rpm": 10}, other={"rpm": 10})
    changes = {"acme": change(file, "acme", {"rpm": 99, "suspended": True})}
    merged = merge(file, changes)
    acme = merged.tenants.tenant("acme")
    assert acme is not None
    assert (acme.rpm, acme.suspended, acme.keys) == (99, True, tenant(file, "acme").keys)
    assert merged.provenance["acme"].applied
    # the file is redeployed with another tenant edited: acme's entry is unchanged, so the change still applies
    redeployed = file_with(acme={"rpm": 10}, other={"rpm": 20})
    assert tenant(merge(redeployed, changes).tenants, "acme").rpm == 99


def test_the_file_wins_once_its_entry_changed_since_the_change() -> None:
    file = file_with(acme={"rpm": 10})
    changes = {"acme": change(file, "acme", {"rpm": 99})}
    edited = file_with(acme={"rpm": 11})
    merged = merge(edited, changes)
    assert tenant(merged.tenants, "acme").rpm == 11
    assert merged.provenance["acme"].superseded
    assert merge(file_with(), changes).tenants.tenant("acme") is None  # removed from the file: gone


def test_run_time_tenants_deletions_and_a_later_file_entry() -> None:
    file = file_with(acme={})
    changes = {"new": change(file, "new", {"tier": "bronze"}), "acme": change(file, "acme", None)}
    merged = merge(file, changes)
    assert [t.id for t in merged.tenants.tenants] == ["new"]
    assert tenant(merged.tenants, "new").keys == ()
    assert not merged.provenance["new"].in_file
    # the file gains a tenant of the same id: the file's version is new since the change, so it wins
    assert tenant(merge(file_with(acme={}, new={"rpm": 5}), changes).tenants, "new").rpm == 5


def test_a_change_to_a_tier_the_file_no_longer_defines_is_ignored_and_bad_documents_are_skipped() -> None:
    file = file_with(acme={})
    changes = {"acme": change(file, "acme", {"tier": "bronze"})}
    no_bronze = TenantsConfig(tiers={"gold": file.tiers["gold"]}, tenants=file.tenants)
    merged = merge(no_bronze, changes)
    assert tenant(merged.tenants, "acme").tier == "gold"
    assert merged.provenance["acme"].superseded
    docs = {"acme": changes["acme"].model_dump_json(), "broken": '{"tenant_id": 3}'}
    assert set(parse_changes(docs)) == {"acme"}
