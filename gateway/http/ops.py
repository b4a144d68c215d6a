"""Operational endpoints: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import JSONResponse, Response

from gateway.http.deps import GatewayDep

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(gw: GatewayDep) -> Response:
    """Ready when at least one probed-healthy, non-ejected worker serves a model."""
    if gw.pool.ready():
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "not ready", "reason": "no healthy worker"}, status_code=503)


@router.get("/metrics")
async def metrics(gw: GatewayDep) -> Response:
    return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)
