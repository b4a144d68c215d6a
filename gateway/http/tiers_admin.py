"""The admin API's tiers at run time: read every tier in force, and change a tier's fields (targets, priority,
speculation preference, sheddable, brownout cap). A tier is neither created nor deleted here: tenants name
tiers, and the tenants file defines them.

A body is validated as the tenants file's tiers are (``fleet.config.TierConfig``; an error names the field),
the change is stored for every replica (``gateway.intake.tenant_book``, precedence in ``fleet.tenants``), and
the admin key's id, the action and the time go to the audit trail (``gateway.usage.audit``). The SLA rules
Prometheus evaluates are generated from the tenants file (``python -m dashboards.build``): a target changed
here shows in the console's attainment at once, in those rules only once the file is.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Header
from pydantic import BaseModel, ValidationError

from fleet.config import ConfigError, TierConfig, parse_model
from fleet.store.keys import DocVersionConflict
from gateway.errors import InvalidRequest, NotFound
from gateway.http import versions
from gateway.http.deps import AdminDep, GatewayDep
from gateway.http.openapi import ERROR_RESPONSES, ErrorBody
from gateway.usage import audit
from gateway.wiring import Gateway

router = APIRouter(
    prefix="/admin/v1",
    responses={
        **ERROR_RESPONSES,
        409: {"model": ErrorBody, "description": "The tier changed since the body's version"},
        412: {"model": ErrorBody, "description": "The tier changed since the version If-Match names"},
    },
)


def _body_schema() -> dict[str, Any]:
    """The PATCH body's JSON schema: ``TierConfig``'s fields (its enums inlined), none required."""
    schema = TierConfig.model_json_schema()
    defs = schema.get("$defs", {})
    properties = {
        name: defs[prop["$ref"].rsplit("/", 1)[-1]] if "$ref" in prop else prop
        for name, prop in schema["properties"].items()
    }
    properties[versions.VERSION_FIELD] = {
        "type": "integer",
        "minimum": 0,
        "description": "The tier's version (GET /admin/v1/tiers) the change is made against; 409 when it moved on.",
    }
    body = {"type": "object", "properties": properties, "additionalProperties": False}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": body}}}}


class TierView(BaseModel):
    """A tier in force, and whether a run-time change made it so."""

    name: str
    config: TierConfig
    changed_at_runtime: bool
    """A run-time change of this tier is in force (it overrides the file's entry)."""
    superseded: bool
    """A run-time change is stored but the file's tier changed since it was made: the file is in force."""
    changed_at: float | None
    """Unix seconds of the stored run-time change, if any."""
    changed_by: str | None
    """The admin key id that made it."""
    version: int = 0
    """The version of the tier's run-time change (0: none yet): send it back (``If-Match`` or ``version``) with a
    change, which is refused if another admin changed the tier since."""


class TierList(BaseModel):
    object: Literal["list"] = "list"
    data: list[TierView]


def _view(gw: Gateway, name: str) -> TierView:
    prov = gw.tenant_book.tier_provenance(name)
    change = prov.change if prov is not None else None
    return TierView(
        name=name,
        config=gw.tenants.tiers[name],
        changed_at_runtime=prov is not None and prov.applied,
        superseded=prov is not None and prov.superseded,
        changed_at=change.changed_at if change else None,
        changed_by=change.changed_by if change else None,
        version=gw.tenant_book.tier_version(name),
    )


def _validated(data: dict[str, Any]) -> TierConfig:
    """``data`` as a tier, checked as the tenants file's tiers are: a 400 that names the first bad field."""
    try:
        return parse_model(TierConfig, data, source="tier")
    except ConfigError as exc:
        cause = exc.__cause__
        errors = cause.errors() if isinstance(cause, ValidationError) else []
        param = ".".join(str(p) for p in errors[0]["loc"]) if errors else None
        raise InvalidRequest(str(exc), param=param or None) from None


@router.get("/tiers")
async def list_tiers(_: AdminDep, gw: GatewayDep) -> TierList:
    """Every tier in force: the tenants file's, with the run-time changes that apply."""
    return TierList(data=[_view(gw, name) for name in sorted(gw.tenants.tiers)])


@router.patch("/tiers/{tier}", openapi_extra=_body_schema())
async def update_tier(
    tier: str,
    body: Annotated[dict[str, Any], Body()],
    who: AdminDep,
    gw: GatewayDep,
    if_match: Annotated[str | None, Header()] = None,
) -> TierView:
    """Change some of a tier's fields (``null`` clears a target); every replica applies it within
    ``tenants_refresh_s``, the controller from its next tick. Made against ``If-Match`` (or the body's ``version``):
    412 (409) when another admin changed the tier since."""
    current = gw.tenants.tiers.get(tier)
    if current is None:
        raise NotFound(f"No tier '{tier}'.", param="tier")
    body = dict(body)
    expected, from_header = versions.expected_version(body, if_match)
    changed = _validated({**current.model_dump(), **body})
    now = gw.clock.wall()
    entry = audit.entry(who=who, action="tier.update", target=tier, now=now, changes=body)
    try:
        await gw.tenant_book.save_tier(
            tier, changed, by=who, now=now, log=audit.LOG, entry=entry, expect_version=expected
        )
    except DocVersionConflict as exc:
        raise versions.refused(tier, exc, expected=expected, header=from_header, kind="Tier") from None
    return _view(gw, tier)
