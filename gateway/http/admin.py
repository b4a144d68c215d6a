"""The admin API (its own keys): create, list and revoke tenant API keys; read any tenant's usage; set the
brownout switch. Each change goes to the audit trail (``gateway.usage.audit``); tenants themselves are
``gateway.http.tenants_admin``'s."""

from __future__ import annotations

import secrets
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from fleet.store.protocol import ApiKeyRecord
from gateway.errors import InvalidRequest, NotFound
from gateway.http.deps import AdminDep, GatewayDep
from gateway.http.openapi import ERROR_RESPONSES
from gateway.http.usage import ledger_page, usage_report
from gateway.intake.brownout import Mode
from gateway.usage import audit
from gateway.wiring import Gateway

router = APIRouter(prefix="/admin/v1", responses=ERROR_RESPONSES)


class CreateKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str
    key_id: Annotated[str | None, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")] = None


@router.post("/keys", status_code=201)
async def create_key(body: CreateKey, who: AdminDep, gw: GatewayDep) -> dict[str, Any]:
    """Create a key for a tenant. The secret is in this response only; the store keeps its keyed digest."""
    if gw.tenants.tenant(body.tenant) is None:
        raise InvalidRequest(f"tenant: unknown tenant '{body.tenant}'.", param="tenant")
    secret = "gs-" + secrets.token_urlsafe(32)
    record = ApiKeyRecord(
        key_id=body.key_id or f"key-{secrets.token_hex(8)}",
        tenant=body.tenant,
        digest=gw.keys.digest(secret),
        created_at=gw.clock.wall(),
    )
    if any(k.key_id == record.key_id for k in await gw.store.api_keys()):
        raise InvalidRequest(f"key_id: '{record.key_id}' already exists.", param="key_id")
    await gw.store.put_api_key(record)
    await audit.record(
        gw.store, who=who, action="key.create", target=record.key_id, now=record.created_at, tenant=record.tenant
    )
    return {"key_id": record.key_id, "tenant": record.tenant, "secret": secret, "created_at": record.created_at}


@router.get("/keys")
async def list_keys(_: AdminDep, gw: GatewayDep, tenant: str | None = None) -> dict[str, Any]:
    """Every key (never a secret): the tenants file's and those created at run time."""
    data: list[dict[str, Any]] = [
        {"key_id": k.id, "tenant": t.id, "source": "tenants-file", "revoked": False, "created_at": None}
        for t in gw.tenants.tenants
        for k in t.keys
        if tenant is None or t.id == tenant
    ]
    data += [
        {"key_id": r.key_id, "tenant": r.tenant, "source": "store", "revoked": r.revoked, "created_at": r.created_at}
        for r in await gw.store.api_keys(tenant)
    ]
    return {"object": "list", "data": data}


@router.delete("/keys/{key_id}")
async def revoke_key(key_id: str, who: AdminDep, gw: GatewayDep) -> dict[str, Any]:
    """Revoke a run-time key; this replica forgets it at once, the others within ``key_cache_ttl_s``."""
    if any(k.id == key_id for t in gw.tenants.tenants for k in t.keys):
        raise InvalidRequest(f"Key '{key_id}' comes from the tenants file: remove it there.", param="key_id")
    records = [r for r in await gw.store.api_keys() if r.key_id == key_id]
    if not records or not await gw.store.revoke_api_key(key_id):
        raise NotFound(f"No API key '{key_id}'.", param="key_id")
    gw.keys.forget(records[0].digest)
    await audit.record(
        gw.store, who=who, action="key.revoke", target=key_id, now=gw.clock.wall(), tenant=records[0].tenant
    )
    return {"key_id": key_id, "revoked": True}


@router.get("/usage/{tenant}")
async def tenant_usage(
    tenant: str,
    _: AdminDep,
    gw: GatewayDep,
    since: float | None = None,
    until: float | None = None,
    limit: Annotated[int, Query(ge=0, le=10_000)] = 100,
) -> dict[str, Any]:
    if gw.tenants.tenant(tenant) is None:
        raise NotFound(f"No tenant '{tenant}'.", param="tenant")
    return await usage_report(gw, tenant, since=since, until=until, limit=limit)


@router.get("/ledger")
async def ledger(
    _: AdminDep,
    gw: GatewayDep,
    since: float = 0.0,
    until: float | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> dict[str, Any]:
    """Every tenant's usage records with ``since <= at < until`` (Unix s), in time order, a page at a time
    (``gearshift usage export`` reads it to make a replay trace)."""
    return await ledger_page(gw, since=since, until=until, limit=limit)


@router.get("/workers")
async def workers(_: AdminDep, gw: GatewayDep) -> dict[str, Any]:
    """The routing view of every worker: health, ejection, in-flight, the published state and its drafter-free
    gear record (``fleet.worker_mode``)."""
    return {
        "object": "list",
        "data": [
            {
                "id": v.id,
                "model": v.config.model,
                "healthy": v.healthy,
                "ejected_until": v.ejected_until or None,
                "in_flight": v.in_flight,
                "state": v.state.model_dump() if v.state else None,
                "mode": v.mode.model_dump(mode="json") if v.mode else None,
            }
            for v in gw.pool.views.values()
        ],
    }


class SetBrownout(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Mode


def _brownout(gw: Gateway) -> dict[str, Any]:
    b = gw.overload.brownout
    return {"mode": b.mode, "active": b.active, "auto_on": b.auto_on}


@router.get("/brownout")
async def get_brownout(_: AdminDep, gw: GatewayDep) -> dict[str, Any]:
    """The brownout switch of this replica: its mode, whether it caps ``max_tokens`` now, and the automatic
    trigger's verdict."""
    return _brownout(gw)


@router.put("/brownout")
async def set_brownout(body: SetBrownout, who: AdminDep, gw: GatewayDep) -> dict[str, Any]:
    """Set this replica's brownout mode: ``on`` caps new requests' ``max_tokens`` to their tier's
    ``brownout_max_tokens``, ``off`` never does, ``auto`` does after sustained overload."""
    gw.overload.brownout.mode = body.mode
    gw.metrics.brownout.set(1.0 if gw.overload.brownout.active else 0.0)
    await audit.record(gw.store, who=who, action="brownout.set", target="brownout", now=gw.clock.wall(), mode=body.mode)
    return _brownout(gw)
