"""The tenant API besides the completions (which ``gateway.http.entry`` serves): the tenant's models and usage."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from gateway.http.deps import GatewayDep, PrincipalDep
from gateway.http.openapi import ERROR_RESPONSES
from gateway.http.usage import usage_report

router = APIRouter(responses=ERROR_RESPONSES)


@router.get("/v1/models")
async def list_models(principal: PrincipalDep, gw: GatewayDep) -> dict[str, Any]:
    """The models this tenant may use."""
    data = [
        {"id": m.name, "object": "model", "created": 0, "owned_by": "gearshift"}
        for m in gw.fleet.models
        if principal.tenant.allows(m.name)
    ]
    return {"object": "list", "data": data}


@router.get("/v1/usage")
async def own_usage(
    principal: PrincipalDep,
    gw: GatewayDep,
    since: Annotated[float | None, Query(description="Unix seconds, inclusive; default 24 h ago")] = None,
    until: Annotated[float | None, Query(description="Unix seconds, exclusive; default now")] = None,
    limit: Annotated[int, Query(ge=0, le=10_000, description="Records to include (oldest first)")] = 100,
) -> dict[str, Any]:
    """The calling tenant's usage over ``[since, until)``."""
    return await usage_report(gw, principal.tenant.id, since=since, until=until, limit=limit)
