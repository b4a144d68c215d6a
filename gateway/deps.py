"""FastAPI dependencies as ``Annotated`` aliases (STYLE 5)."""

from __future__ import annotations

import hmac
from typing import Annotated, cast

from fastapi import Depends, Request

from gateway.auth import Principal, bearer_secret
from gateway.core import Gateway
from gateway.errors import AuthenticationFailed, BodyTooLarge, InvalidRequest


def get_gateway(request: Request) -> Gateway:
    return cast(Gateway, request.app.state.gateway)


GatewayDep = Annotated[Gateway, Depends(get_gateway)]


async def get_principal(request: Request, gw: GatewayDep) -> Principal:
    """The tenant behind the request's Bearer key."""
    return await gw.keys.authenticate(request.headers.get("authorization"))


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def require_admin(request: Request, gw: GatewayDep) -> None:
    """The admin API takes its own key, compared in constant time."""
    secret = bearer_secret(request.headers.get("authorization"))
    if not hmac.compare_digest(secret.encode(), gw.settings.admin_key.get_secret_value().encode()):
        raise AuthenticationFailed("Incorrect admin key.")


AdminDep = Annotated[None, Depends(require_admin)]


def get_request_id(request: Request) -> str:
    return cast(str, request.scope["state"]["request_id"])


RequestIdDep = Annotated[str, Depends(get_request_id)]


async def read_body(request: Request, gw: GatewayDep) -> bytes:
    """The raw request body, refused with 413 beyond ``max_body_bytes`` (checked before and while reading)."""
    limit = gw.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidRequest("Content-Length is not a number.")
        if int(declared) > limit:
            raise BodyTooLarge(f"The request body is {declared} bytes; the limit is {limit} bytes.")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"The request body exceeds the limit of {limit} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


BodyDep = Annotated[bytes, Depends(read_body)]
