"""The app factory: ``create_app(deps)``; resources are built in the lifespan, and every
error FastAPI sees is rendered by ``errors.respond``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from gateway import errors
from gateway.http import console
from gateway.http.admin import router as admin_router
from gateway.http.entry import GatewayApp
from gateway.http.openapi import install_openapi
from gateway.http.ops import router as ops_router
from gateway.http.tenant import router as tenant_router
from gateway.http.tenants_admin import router as tenants_admin_router
from gateway.http.tiers_admin import router as tiers_admin_router
from gateway.wiring import GatewayDeps, running_gateway

log = logging.getLogger(__name__)


def create_app(deps: GatewayDeps) -> FastAPI:
    """The gateway app, its resources built from ``deps`` in the lifespan (the store is the caller's: not closed
    here)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with running_gateway(deps) as gw:
            app.state.gateway = gw
            yield

    app = GatewayApp(  # a FastAPI app whose two completion routes skip FastAPI's stack (gateway/http/entry.py)
        title="gearshift gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        # The gateway makes its own spans and metrics; FastAPI's generic ones would cost time on every request.
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    app.include_router(tenant_router)
    app.include_router(admin_router)
    app.include_router(tenants_admin_router)
    app.include_router(tiers_admin_router)
    console.install(app, deps.settings, clock=deps.clock)
    app.include_router(ops_router)
    install_error_handlers(app)
    fleet, tiers = deps.fleet, deps.tenants.tiers
    install_openapi(app, example_model=fleet.models[0].name if fleet.models else "model", tiers=tiers)
    return app


def _respond(request: Request, exc: errors.GatewayError) -> Response:
    gw = getattr(request.app.state, "gateway", None)
    return errors.respond(exc, gw.metrics if gw is not None else None)


def install_error_handlers(app: FastAPI) -> None:
    """One handler per error family, each turning the error into a member of the error tree."""

    async def gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, errors.GatewayError)
        return _respond(request, exc)

    async def validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in first["loc"] if p not in ("body", "query", "path"))
        return _respond(request, errors.InvalidRequest(f"{param or 'request'}: {first['msg']}", param=param))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return _respond(request, errors.from_http_status(exc.status_code, str(exc.detail), exc.headers))

    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error", exc_info=exc)
        return _respond(request, errors.GatewayError("Internal error in the gateway."))

    app.add_exception_handler(errors.GatewayError, gateway_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
