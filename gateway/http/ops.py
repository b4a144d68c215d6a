"""Operational endpoints: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
import math
from typing import Annotated

from fastapi import APIRouter, Header
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import JSONResponse, Response

from fleet.bearer import bearer_matches
from gateway.errors import AuthenticationFailed
from gateway.http.deps import GatewayDep
from gateway.wiring import Gateway

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


_STORE_PING_S = 1.0
"""How long ``/readyz`` waits for the shared store's PING, seconds."""


@router.get("/readyz")
async def readyz(gw: GatewayDep) -> Response:
    """Ready when at least one probed-healthy, non-ejected worker serves a model; with ``ready_without_workers``,
    ready also while none is (``"workers": "none ready"``: requests get 503 with ``Retry-After``), else 503 with
    ``Retry-After``. The ``store`` detail says whether the shared store answers; during an outage the gateway stays
    ready (``store_failure_mode=open``) and enforces ``fail_open_share`` of each limit (1 / ``replicas``), and
    ``spool_bytes`` shows usage waiting for the store."""
    store = await _store_detail(gw)
    if gw.pool.ready():
        return JSONResponse({"status": "ready", **store})
    if gw.settings.ready_without_workers:
        return JSONResponse({"status": "ready", "workers": "none ready", **store})
    retry = {"retry-after": str(max(1, math.ceil(gw.settings.no_worker_retry_after_s)))}
    body = {"status": "not ready", "reason": "no healthy worker", **store}
    return JSONResponse(body, status_code=503, headers=retry)


async def _store_detail(gw: Gateway) -> dict[str, object]:
    try:
        async with asyncio.timeout(_STORE_PING_S):
            up = await gw.store.ping()
    except TimeoutError:
        up = False
    gw.metrics.store_up.set(1 if up else 0)
    if up:
        return {"store": "ok"}
    share = {"replicas": gw.replicas.count, "fail_open_share": gw.replicas.share()}
    return {"store": "unavailable", **share, **gw.ledger.spool_detail()}


@router.get("/metrics")
async def metrics(gw: GatewayDep, authorization: Annotated[str | None, Header()] = None) -> Response:
    """The Prometheus exposition; with ``GEARSHIFT_METRICS_TOKEN`` set, only for ``Authorization: Bearer <it>``
    (401 otherwise). Tenant labels carry ids or their salted hashes (``GEARSHIFT_METRICS_TENANT_LABEL``)."""
    token = gw.settings.metrics_token
    if token is not None and not bearer_matches(authorization, token.get_secret_value()):
        raise AuthenticationFailed(
            "/metrics needs the metrics token: send 'Authorization: Bearer <GEARSHIFT_METRICS_TOKEN>'.",
            code="invalid_metrics_token",
        )
    return Response(gw.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
