"""The console's pages (GET): fleet, tenants, one tenant, tiers, costs. Each reads through ``reads`` (the admin
API's functions) and computes its figures with ``views``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from fleet.config import SpeculationMode, SpeculationPreference
from fleet.store.protocol import UsageRecord
from gateway.http import admin, tenants_admin, tiers_admin
from gateway.http.console import reads, views
from gateway.http.console.auth import ConsoleDep, SessionDep
from gateway.http.console.render import HtmlErrors
from gateway.http.deps import GatewayDep
from gateway.wiring import Gateway

FLEET_WINDOW_S = 300.0
"""The fleet page's TPOT quantiles are over the ledger's last five minutes."""
TIER_WINDOW_S = 3600.0
COST_WINDOW_S = 3600.0
USAGE_WINDOW_S = 24 * 3600.0
USAGE_BUCKETS = 24
AUDIT_SHOWN = 50

router = APIRouter(route_class=HtmlErrors)


def _messages(request: Request) -> dict[str, list[str]]:
    """An action's outcome, carried to the page it redirects to (``?error=…`` or ``?notice=…``)."""
    return {
        "errors": request.query_params.getlist("error"),
        "notices": request.query_params.getlist("notice"),
    }


@router.get("")
@router.get("/")
async def home(console: ConsoleDep) -> Response:
    return RedirectResponse(f"{console.pages.base}/fleet", status_code=303)


async def _fleet_context(gw: Gateway, who: str) -> dict[str, Any]:
    now = gw.clock.wall()
    records = await reads.ledger_since(gw, who, since=now - FLEET_WINDOW_S)
    plans = await reads.plans(gw)
    rows = views.fleet_rows(await reads.workers(gw, who), records, plans)
    return {
        "workers": rows,
        "records": len(records),
        "window_min": round(FLEET_WINDOW_S / 60),
        "plans": [(plan, plan.fresh(now)) for _, plan in sorted(plans.items())],
    }


@router.get("/fleet")
async def fleet(request: Request, console: ConsoleDep, session: SessionDep, gw: GatewayDep) -> Response:
    context = {**await _fleet_context(gw, session.admin_id), **_messages(request), "session": session}
    return console.pages.render("fleet.html.j2", context, title="Fleet")


@router.get("/fleet/table")
async def fleet_table(console: ConsoleDep, session: SessionDep, gw: GatewayDep) -> Response:
    """The fleet table alone, which the fleet page polls (htmx) every few seconds."""
    return console.pages.render("fleet_table.html.j2", await _fleet_context(gw, session.admin_id))


async def _tenant_summary(gw: Gateway, who: str, view: tenants_admin.TenantView) -> dict[str, Any]:
    now = gw.clock.wall()
    usage = await admin.tenant_usage(view.id, who, gw, since=now - USAGE_WINDOW_S, until=None, limit=10_000)
    records = [UsageRecord.model_validate(r) for r in usage["data"]]
    series = views.usage_series(records, since=now - USAGE_WINDOW_S, until=now, buckets=USAGE_BUCKETS)
    return {
        "view": view,
        "spent_usd": view.spent_usd,
        "usage": usage,
        "chart": views.sparkline(series),
        "chart_large": views.sparkline(series, width=480, height=64),
    }


@router.get("/tenants")
async def tenants(request: Request, console: ConsoleDep, session: SessionDep, gw: GatewayDep) -> Response:
    who = session.admin_id
    listed = (await tenants_admin.list_tenants(who, gw)).data
    context = {
        "tenants": [await _tenant_summary(gw, who, view) for view in listed],
        "tier_names": sorted(gw.tenants.tiers),
        "audit": await reads.recent_audit(gw, who, since=gw.clock.wall() - USAGE_WINDOW_S, shown=AUDIT_SHOWN),
        "session": session,
        **_messages(request),
    }
    return console.pages.render("tenants.html.j2", context, title="Tenants")


async def tenant_context(gw: Gateway, who: str, tenant_id: str) -> dict[str, Any]:
    """Everything the tenant page shows (also rendered by the key-creation action, with the new secret)."""
    view = await tenants_admin.tenant_view(gw, tenant_id)
    since = gw.clock.wall() - USAGE_WINDOW_S
    return {
        "t": await _tenant_summary(gw, who, view),
        "keys": (await admin.list_keys(who, gw, tenant=tenant_id))["data"],
        "tier_names": sorted(gw.tenants.tiers),
        "audit": await reads.recent_audit(gw, who, since=since, shown=AUDIT_SHOWN, target=tenant_id),
    }


@router.get("/tenants/{tenant_id}")
async def tenant(
    tenant_id: str, request: Request, console: ConsoleDep, session: SessionDep, gw: GatewayDep
) -> Response:
    context = {**await tenant_context(gw, session.admin_id, tenant_id), "session": session, **_messages(request)}
    return console.pages.render("tenant.html.j2", context, title="Tenants")


@router.get("/tiers")
async def tiers(request: Request, console: ConsoleDep, session: SessionDep, gw: GatewayDep) -> Response:
    who = session.admin_id
    listed = (await tiers_admin.list_tiers(who, gw)).data
    records = await reads.ledger_since(gw, who, since=gw.clock.wall() - TIER_WINDOW_S)
    configs = {t.name: t.config for t in listed}
    context = {
        "tiers": views.tier_rows(configs, records, changed=[t.name for t in listed if t.changed_at_runtime]),
        "versions": {t.name: t.version for t in listed},
        "preferences": [p.value for p in SpeculationPreference],
        "modes": [m.value for m in SpeculationMode],
        "session": session,
        **_messages(request),
    }
    return console.pages.render("tiers.html.j2", context, title="Tiers")


@router.get("/costs")
async def costs(request: Request, console: ConsoleDep, session: SessionDep, gw: GatewayDep) -> Response:
    who = session.admin_id
    records = await reads.ledger_since(gw, who, since=gw.clock.wall() - COST_WINDOW_S)
    workers = views.fleet_rows(await reads.workers(gw, who), [], {})
    states = {w.worker_id: w.state for w in workers if w.state is not None}
    context = {
        "rows": views.cost_rows(records, states),
        "workers": workers,
        "window_h": round(COST_WINDOW_S / 3600),
        "session": session,
        **_messages(request),
    }
    return console.pages.render("costs.html.j2", context, title="Costs")
