"""fleet.tenants: tiers changed at run time, with the same precedence over the tenants file as tenants."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from fleet.config import TenantsConfig, TierConfig
from fleet.store.memory import MemoryStore
from fleet.tenants import (
    COLLECTION,
    TierChange,
    entry_digest,
    merge,
    merge_docs,
    parse_changes,
    parse_tier_changes,
    read_merged,
    tier_doc_id,
)


def file_with(**tiers: dict[str, Any]) -> TenantsConfig:
    return TenantsConfig.model_validate({"tiers": tiers, "tenants": [{"id": "acme", "tier": "gold"}]})


def tier_change(file: TenantsConfig, name: str, **fields: Any) -> TierChange:
    return TierChange(
        tier_name=name,
        tier=TierConfig.model_validate({**file.tiers[name].model_dump(), **fields}),
        file_digest=entry_digest(file.tiers[name]),
        changed_at=1.0,
        changed_by="admin",
    )


def test_a_tier_change_applies_while_the_file_tier_is_the_one_it_was_made_against() -> None:
    file = file_with(gold={"tpot_target_s": 0.05}, bronze={})
    changes = {"gold": tier_change(file, "gold", tpot_target_s=0.08, priority=-1)}
    merged = merge(file, {}, changes)
    assert (merged.tenants.tiers["gold"].tpot_target_s, merged.tenants.tiers["gold"].priority) == (0.08, -1)
    assert merged.tenants.tiers["bronze"] == file.tiers["bronze"]
    assert merged.tier_provenance["gold"].applied
    assert merged.tier_provenance["bronze"].change is None
    edited = file_with(gold={"tpot_target_s": 0.04}, bronze={})
    again = merge(edited, {}, changes)
    assert again.tenants.tiers["gold"].tpot_target_s == 0.04
    assert again.tier_provenance["gold"].superseded


def test_a_change_to_a_tier_the_file_dropped_is_ignored() -> None:
    file = file_with(gold={}, bronze={})
    changes = {"bronze": tier_change(file, "bronze", priority=5)}
    merged = merge(file_with(gold={}), {}, changes)
    assert set(merged.tenants.tiers) == {"gold"}


def test_tier_documents_share_the_tenants_collection_without_being_read_as_tenants(
    caplog: pytest.LogCaptureFixture,
) -> None:
    file = file_with(gold={}, bronze={})
    docs = {tier_doc_id("gold"): tier_change(file, "gold", sheddable=True).model_dump_json()}
    with caplog.at_level(logging.WARNING):
        assert parse_changes(docs) == {}
    assert caplog.records == []
    assert set(parse_tier_changes(docs)) == {"gold"}
    assert merge_docs(file, docs).tenants.tiers["gold"].sheddable


async def test_read_merged_applies_the_stored_tier_changes() -> None:
    file = file_with(gold={"ttft_target_s": 2.0}, bronze={})
    store = MemoryStore()
    await store.put_doc(COLLECTION, tier_doc_id("gold"), tier_change(file, "gold", ttft_target_s=1.0).model_dump_json())
    assert (await read_merged(file, store)).tenants.tiers["gold"].ttft_target_s == 1.0
