"""FastAPI dependencies as ``Annotated`` aliases (STYLE 5)."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import Depends, Request

from fleet.bearer import bearer_matches
from gateway.errors import AuthenticationFailed
from gateway.intake.auth import Principal, presented_secret
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
    (``GatewaySettings.admin_credentials``), which the audit trail records."""
    authorization = request.headers.get("authorization")
    presented_secret(authorization)  # 401 for a missing or malformed header, with its own message
    matched = [i for i, key in gw.settings.admin_credentials().items() if bearer_matches(authorization, key)]
    if not matched:
        raise AuthenticationFailed("Incorrect admin key.")
    return matched[0]


AdminDep = Annotated[str, Depends(require_admin)]
"""The id of the admin key that authorised the request."""
