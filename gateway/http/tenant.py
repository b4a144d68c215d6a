"""The tenant API besides the completions (which ``gateway.http.entry`` serves): the tenant's models and usage."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel

from gateway.errors import ModelNotFound
from gateway.http.deps import GatewayDep, PrincipalDep
from gateway.http.openapi import ERROR_RESPONSES
from gateway.http.usage import usage_report

router = APIRouter(responses=ERROR_RESPONSES)


class ModelObject(BaseModel):
    """OpenAI's model object."""

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    """Unix seconds (the fleet file has no creation time: 0)."""
    owned_by: str = "gearshift"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]


@router.get("/v1/models")
async def list_models(principal: PrincipalDep, gw: GatewayDep) -> ModelList:
    """The models this tenant may use."""
    return ModelList(data=[ModelObject(id=m.name) for m in gw.fleet.models if principal.tenant.allows(m.name)])


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, principal: PrincipalDep, gw: GatewayDep) -> ModelObject:
    """One model this tenant may use; 404 ``model_not_found`` for a model that does not exist or that the tenant
    may not use (as OpenAI answers: a tenant cannot tell the two apart)."""
    if gw.fleet.model(model) is None or not principal.tenant.allows(model):
        message = f"The model '{model}' does not exist or you do not have access to it."
        raise ModelNotFound(message, param="model")
    return ModelObject(id=model)


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
