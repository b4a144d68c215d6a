"""The admin API's tenants at run time: create, read, change (tier, models, limits, budget, ``suspended``) and
delete tenants, reset a budget, and read the audit trail of every admin change.

A body is validated as the tenants file is (``fleet.config.TenantConfig``; an error names the field), the
change is stored for every replica (``gateway.intake.tenant_book``), and the admin key's id, the action and the time go
to the audit trail (``gateway.usage.audit``). Precedence over the file is ``fleet.tenants``'.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Header, Query, Response
from pydantic import BaseModel, ValidationError

from fleet.budget_period import BudgetPeriod, budget_key, period_span
from fleet.config import ConfigError, SpeculationMode, TenantConfig, parse_model
from fleet.store.keys import DocVersionConflict
from gateway.errors import Conflict, InvalidRequest, NotFound
from gateway.http import versions
from gateway.http.deps import AdminDep, GatewayDep
from gateway.http.openapi import ERROR_RESPONSES, ErrorBody
from gateway.usage import audit
from gateway.wiring import Gateway

router = APIRouter(
    prefix="/admin/v1",
    responses={
        **ERROR_RESPONSES,
        409: {"model": ErrorBody, "description": "The tenant already exists, or changed since the body's version"},
        412: {"model": ErrorBody, "description": "The tenant changed since the version If-Match names"},
    },
)

_SETTABLE = {name for name in TenantConfig.model_fields if name not in ("id", "keys")}


def _body_schema(*, create: bool) -> dict[str, Any]:
    """The request body's JSON schema, from ``TenantConfig``'s: every field an admin may set (``id`` only when
    creating; keys are issued with ``POST /admin/v1/keys``)."""
    schema = TenantConfig.model_json_schema()
    keep = _SETTABLE | ({"id"} if create else set())
    properties = {k: v for k, v in schema["properties"].items() if k in keep}
    required = ["id", "tier"] if create else []
    if not create:
        properties[versions.VERSION_FIELD] = {
            "type": "integer",
            "minimum": 0,
            "description": "The version (ETag) the change is made against; 409 when the tenant has moved on since.",
        }
    body = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": body}}}}


class TenantView(BaseModel):
    """A tenant in force, and where its definition comes from."""

    id: str
    tier: str
    models: list[str]
    rpm: int | None
    tpm: int | None
    max_concurrency: int | None
    budget_usd: float | None
    """USD; the spend it is checked against is ``spent_usd`` of ``GET /admin/v1/tenants/{id}``."""
    budget_period: BudgetPeriod = "total"
    """What ``budget_usd`` is per: ``total`` (all time) or a UTC calendar ``daily``, ``weekly``, ``monthly`` period."""
    suspended: bool
    workload: str | None
    speculation_header: list[SpeculationMode] = []
    """The ``x-gearshift-speculation`` values the tenant may send (empty: the header is refused)."""
    key_ids: list[str]
    """The tenants file's keys of this tenant (run-time keys: ``GET /admin/v1/keys``)."""
    source: Literal["tenants-file", "runtime"]
    """Where the tenant is defined: the tenants file, or only at run time."""
    changed_at_runtime: bool
    """A run-time change is in force (for a file tenant: it overrides the file's entry)."""
    superseded: bool
    """A run-time change is stored but the file's entry changed since it was made: the file is in force."""
    changed_at: float | None
    """Unix seconds of the stored run-time change, if any."""
    changed_by: str | None
    """The admin key id that made it."""
    version: int = 0
    """The version of the tenant's run-time change (0: none yet), also its ``ETag``: send it back as ``If-Match`` (or
    ``version``) with a change, which is refused if another admin changed the tenant since."""
    spent_usd: float = 0.0
    """USD spent against ``budget_usd`` in the current budget period (its spend counter, which ``budget/reset``
    zeroes)."""
    period_started_at: float | None = None
    """Unix seconds when the current budget period began (None for ``total``)."""
    next_reset_at: float | None = None
    """Unix seconds when the budget next resets by itself: the next period's first instant (None for ``total``)."""


class TenantList(BaseModel):
    object: Literal["list"] = "list"
    data: list[TenantView]


class Deleted(BaseModel):
    id: str
    deleted: Literal[True] = True


class BudgetReset(BaseModel):
    id: str
    budget_usd: float | None
    spent_before_usd: float
    """The spend the reset took off the tenant's counter (the current period's), USD."""
    budget_period: BudgetPeriod = "total"
    next_reset_at: float | None = None
    """Unix seconds of the period's own reset (None for ``total``)."""


class AuditList(BaseModel):
    object: Literal["list"] = "list"
    data: list[audit.AuditEntry]


async def _view(gw: Gateway, tenant: TenantConfig) -> TenantView:
    prov = gw.tenant_book.provenance(tenant.id)
    change = prov.change if prov is not None else None
    now = gw.clock.wall()
    span = period_span(tenant.budget_period, now)
    return TenantView(
        **tenant.model_dump(include=_SETTABLE | {"id"}),
        key_ids=[k.id for k in tenant.keys],
        source="tenants-file" if prov is None or prov.in_file else "runtime",
        changed_at_runtime=prov is not None and prov.applied,
        superseded=prov is not None and prov.superseded,
        changed_at=change.changed_at if change else None,
        changed_by=change.changed_by if change else None,
        version=gw.tenant_book.version(tenant.id),
        spent_usd=await gw.store.spent(budget_key(tenant.id, tenant.budget_period, now)),
        period_started_at=span.start if span.resets else None,
        next_reset_at=span.end if span.resets else None,
    )


def _validated(gw: Gateway, data: dict[str, Any]) -> TenantConfig:
    """``data`` as a tenant, checked as the tenants file's entries are: a 400 that names the first bad field."""
    if "keys" in data:
        raise InvalidRequest("tenant: keys: API keys are issued with POST /admin/v1/keys.", param="keys")
    try:
        tenant = parse_model(TenantConfig, data, source="tenant")
    except ConfigError as exc:
        cause = exc.__cause__
        errors = cause.errors() if isinstance(cause, ValidationError) else []
        param = ".".join(str(p) for p in errors[0]["loc"]) if errors else None
        raise InvalidRequest(str(exc), param=param or None) from None
    if tenant.tier not in gw.tenants.tiers:
        known = sorted(gw.tenants.tiers)
        raise InvalidRequest(f"tenant: tier: unknown tier {tenant.tier!r}; known: {known}", param="tier")
    return tenant


def _existing(gw: Gateway, tenant_id: str) -> TenantConfig:
    tenant = gw.tenant_book.tenant(tenant_id)
    if tenant is None:
        raise NotFound(f"No tenant '{tenant_id}'.", param="tenant_id")
    return tenant


@router.get("/tenants")
async def list_tenants(_: AdminDep, gw: GatewayDep) -> TenantList:
    """Every tenant in force: the tenants file's, with the run-time changes that apply, and those created at run
    time."""
    return TenantList(data=[await _view(gw, t) for t in gw.tenants.tenants])


@router.post("/tenants", status_code=201, openapi_extra=_body_schema(create=True))
async def create_tenant(body: Annotated[dict[str, Any], Body()], who: AdminDep, gw: GatewayDep) -> TenantView:
    """Create a tenant (every replica serves it within ``tenants_refresh_s``); 409 when one with that id is in
    force."""
    tenant = _validated(gw, body)
    if gw.tenant_book.tenant(tenant.id) is not None:
        raise Conflict(f"Tenant '{tenant.id}' already exists: change it with PATCH.", param="id")
    now = gw.clock.wall()
    entry = audit.entry(who=who, action="tenant.create", target=tenant.id, now=now, tenant=body)
    try:
        await gw.tenant_book.save(tenant.id, tenant, by=who, now=now, log=audit.LOG, entry=entry)
    except DocVersionConflict:  # created meanwhile through another replica
        raise Conflict(f"Tenant '{tenant.id}' already exists: change it with PATCH.", param="id") from None
    return await _view(gw, _existing(gw, tenant.id))


async def tenant_view(gw: Gateway, tenant_id: str) -> TenantView:
    """The tenant in force (404 when none), as ``GET /admin/v1/tenants/{id}`` answers it."""
    return await _view(gw, _existing(gw, tenant_id))


@router.get("/tenants/{tenant_id}")
async def get_tenant(tenant_id: str, _: AdminDep, gw: GatewayDep, response: Response) -> TenantView:
    """The tenant, with its version as the ``ETag`` (send it back as ``If-Match`` with a change)."""
    view = await tenant_view(gw, tenant_id)
    response.headers["etag"] = versions.etag(view.version)
    return view


async def change_tenant(
    gw: Gateway, tenant_id: str, body: dict[str, Any], who: str, *, if_match: str | None = None
) -> TenantView:
    """``PATCH /admin/v1/tenants/{id}`` without HTTP: the console's edit form calls it with the body's ``version``."""
    current = _existing(gw, tenant_id)
    body = dict(body)
    expected, from_header = versions.expected_version(body, if_match)
    if "id" in body:
        raise InvalidRequest("tenant: id: a tenant's id cannot change.", param="id")
    tenant = _validated(gw, {**current.model_dump(include=_SETTABLE), **body, "id": tenant_id})
    now = gw.clock.wall()
    entry = audit.entry(who=who, action="tenant.update", target=tenant_id, now=now, changes=body)
    try:
        await gw.tenant_book.save(
            tenant_id, tenant, by=who, now=now, log=audit.LOG, entry=entry, expect_version=expected
        )
    except DocVersionConflict as exc:
        raise versions.refused(tenant_id, exc, expected=expected, header=from_header) from None
    return await _view(gw, _existing(gw, tenant_id))


@router.patch("/tenants/{tenant_id}", openapi_extra=_body_schema(create=False))
async def update_tenant(
    tenant_id: str,
    body: Annotated[dict[str, Any], Body()],
    who: AdminDep,
    gw: GatewayDep,
    response: Response,
    if_match: Annotated[str | None, Header()] = None,
) -> TenantView:
    """Change some of a tenant's fields (``null`` clears a limit); a budget raised here applies to the next
    request on every replica, with no restart. Made against ``If-Match`` (or the body's ``version``): 412 (409)
    when another admin changed the tenant since; the answer's ``ETag`` is the new version."""
    view = await change_tenant(gw, tenant_id, body, who, if_match=if_match)
    response.headers["etag"] = versions.etag(view.version)
    return view


@router.delete("/tenants/{tenant_id}")
async def delete_tenant(
    tenant_id: str, who: AdminDep, gw: GatewayDep, if_match: Annotated[str | None, Header()] = None
) -> Deleted:
    """Delete a tenant: its keys stop authenticating on every replica. A tenants-file tenant stays deleted until
    its entry in the file changes (``fleet.tenants``). With ``If-Match``, only at that version (else 412)."""
    _existing(gw, tenant_id)
    expected = versions.parse_if_match(if_match)
    now = gw.clock.wall()
    entry = audit.entry(who=who, action="tenant.delete", target=tenant_id, now=now)
    try:
        await gw.tenant_book.save(tenant_id, None, by=who, now=now, log=audit.LOG, entry=entry, expect_version=expected)
    except DocVersionConflict as exc:
        raise versions.refused(tenant_id, exc, expected=expected, header=expected is not None) from None
    return Deleted(id=tenant_id)


@router.post("/tenants/{tenant_id}/budget/reset")
async def reset_budget(tenant_id: str, who: AdminDep, gw: GatewayDep) -> BudgetReset:
    """Start the tenant's budget afresh: its spend counter (the current period's) goes back to zero (spend still
    being settled counts after the reset). The usage ledger keeps every record."""
    tenant = _existing(gw, tenant_id)
    now = gw.clock.wall()
    key = budget_key(tenant.id, tenant.budget_period, now)
    spent = await gw.store.spent(key)
    if spent:
        await gw.store.settle(windows=(), slots=(), spend={key: -spent}, now=now)
    await audit.record(gw.store, who=who, action="tenant.budget_reset", target=tenant_id, now=now, spent_usd=spent)
    span = period_span(tenant.budget_period, now)
    return BudgetReset(
        id=tenant_id,
        budget_usd=tenant.budget_usd,
        spent_before_usd=spent,
        budget_period=tenant.budget_period,
        next_reset_at=span.end if span.resets else None,
    )


@router.get("/audit")
async def read_audit(
    _: AdminDep,
    gw: GatewayDep,
    since: float = 0.0,
    until: float | None = None,
    limit: Annotated[int, Query(ge=0, le=10_000)] = 100,
) -> AuditList:
    """The admin audit trail, oldest first: who (the admin key's id), what and when, for every admin change."""
    end = until if until is not None else gw.clock.wall() + 1.0
    return AuditList(data=await audit.read(gw.store, since=since, until=end, limit=limit))
