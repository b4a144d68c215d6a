"""The OpenAI-compatible API tenants call.

The two completion routes declared here are served at run time by ``gateway.fastpath`` (the same pipeline,
without FastAPI's per-request stack); they stay declared so the OpenAPI document describes them.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from starlette.responses import Response

from gateway.deps import CompletionDep, GatewayDep, PrincipalDep
from gateway.openapi import CHAT_BODY, ERROR_RESPONSES, TEXT_BODY
from gateway.pipeline import CHAT, TEXT, complete
from gateway.usage import usage_report

router = APIRouter(responses=ERROR_RESPONSES)


@router.post("/v1/chat/completions", openapi_extra=CHAT_BODY)
async def chat_completions(call: CompletionDep) -> Response:
    return await complete(
        call.gw, call.principal, call.raw, endpoint=CHAT, request_id=call.request_id, started=call.started,
        receive=call.receive,
    )  # fmt: skip


@router.post("/v1/completions", openapi_extra=TEXT_BODY)
async def completions(call: CompletionDep) -> Response:
    return await complete(
        call.gw, call.principal, call.raw, endpoint=TEXT, request_id=call.request_id, started=call.started,
        receive=call.receive,
    )  # fmt: skip


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
