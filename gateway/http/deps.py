"""FastAPI dependencies as ``Annotated`` aliases (STYLE 5)."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import Depends, Request

from gateway.intake.admin_guard import ADMIN_ID
from gateway.intake.auth import Principal
from gateway.wiring import Gateway


# Every dependency is ``async def``: FastAPI runs plain ``def`` dependencies in a thread pool, which would cost a
# thread hop per dependency per request.
async def get_gateway(request: Request) -> Gateway:
    return cast(Gateway, request.app.state.gateway)


GatewayDep = Annotated[Gateway, Depends(get_gateway)]


async def get_principal(request: Request, gw: GatewayDep) -> Principal:
    """The tenant behind the request's Bearer key."""
    return await gw.keys.authenticate(request.headers.get("authorization"))


PrincipalDep = Annotated[Principal, Depends(get_principal)]


async def require_admin(request: Request, gw: GatewayDep) -> str:
    """The admin API takes its own keys, each compared in constant time; the id of the key presented
    (``GatewaySettings.admin_credentials``), which the audit trail records. The ASGI entry has already checked it,
    before reading the body (``gateway.http.entry``); a route reached any other way is checked here."""
    who = request.scope.get("state", {}).get(ADMIN_ID)
    if isinstance(who, str):
        return who
    client = request.client.host if request.client is not None else ""
    return gw.admin_guard.authorize(request.headers.get("authorization"), client)


AdminDep = Annotated[str, Depends(require_admin)]
"""The id of the admin key that authorised the request."""
