"""FastAPI dependencies as ``Annotated`` aliases (STYLE 5)."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated, cast

from fastapi import Depends, Request
from starlette.requests import ClientDisconnect
from starlette.types import Receive

from gateway.auth import Principal, bearer_secret
from gateway.core import Gateway
from gateway.errors import AuthenticationFailed, BodyTooLarge, ClientDisconnected, InvalidRequest


# Every dependency is ``async def``: FastAPI runs plain ``def`` dependencies in a thread pool, which would cost a
# thread hop per dependency per request on the hot path.
async def get_gateway(request: Request) -> Gateway:
    return cast(Gateway, request.app.state.gateway)


GatewayDep = Annotated[Gateway, Depends(get_gateway)]


async def get_principal(request: Request, gw: GatewayDep) -> Principal:
    """The tenant behind the request's Bearer key."""
    return await gw.keys.authenticate(request.headers.get("authorization"))


PrincipalDep = Annotated[Principal, Depends(get_principal)]


async def require_admin(request: Request, gw: GatewayDep) -> None:
    """The admin API takes its own key, compared in constant time."""
    secret = bearer_secret(request.headers.get("authorization"))
    if not hmac.compare_digest(secret.encode(), gw.settings.admin_key.get_secret_value().encode()):
        raise AuthenticationFailed("Incorrect admin key.")


AdminDep = Annotated[None, Depends(require_admin)]


async def get_request_id(request: Request) -> str:
    return cast(str, request.scope["state"]["request_id"])


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidRequest("Content-Length is not a number.")
        if int(declared) > limit:
            raise BodyTooLarge(f"The request body is {declared} bytes; the limit is {limit} bytes.")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(f"The request body exceeds the limit of {limit} bytes.")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientDisconnected("The client closed the connection while sending the body.") from None
    return b"".join(chunks)


@dataclass(frozen=True, slots=True)
class CompletionInput:
    """Everything a completion route needs, resolved by one dependency (each FastAPI dependency costs time)."""

    gw: Gateway
    principal: Principal
    raw: bytes
    request_id: str
    started: float
    """The clock's monotonic time when the request reached the route, seconds."""
    receive: Receive


async def completion_input(request: Request) -> CompletionInput:
    """Authenticate first (no body is read for an unknown caller), then read the body within its limit."""
    gw = await get_gateway(request)
    started = gw.clock.monotonic()
    principal = await gw.keys.authenticate(request.headers.get("authorization"))
    raw = await _read_body(request, gw.settings.max_body_bytes)
    return CompletionInput(gw, principal, raw, await get_request_id(request), started, request.receive)


CompletionDep = Annotated[CompletionInput, Depends(completion_input)]
