"""The console's forms (POST, each with its session's CSRF token): every change is one call of the admin API's
own function, so it is validated, stored and audited exactly as ``/admin/v1`` and the CLI do it. The console
writes nothing to the store itself. After a change the browser is sent back to the page (post/redirect/get),
with the admin API's error message (which names the field) when it refused."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter
from starlette.responses import RedirectResponse, Response

from gateway.errors import GatewayError
from gateway.http import admin, tenants_admin, tiers_admin
from gateway.http.console import forms
from gateway.http.console.auth import ConsoleDep, FormDep, SessionDep
from gateway.http.console.pages import tenant_context
from gateway.http.console.render import HtmlErrors
from gateway.http.deps import GatewayDep

router = APIRouter(route_class=HtmlErrors)


async def perform(back: str, change: Callable[[], Awaitable[Any]], *, notice: str) -> Response:
    """Make ``change`` and send the browser back to ``back`` with ``notice``, or with the admin API's error."""
    try:
        await change()
    except GatewayError as exc:
        return _back(back, error=exc.message)
    return _back(back, notice=notice)


def _back(page: str, **message: str) -> Response:
    """To ``page`` (post/redirect/get) with ``error=…`` or ``notice=…`` for it to show."""
    return RedirectResponse(f"{page}?{urlencode(message)}", status_code=303)


@router.post("/tenants")
async def create_tenant(console: ConsoleDep, session: SessionDep, form: FormDep, gw: GatewayDep) -> Response:
    body = forms.tenant_body(form, create=True)
    return await perform(
        f"{console.pages.base}/tenants",
        lambda: tenants_admin.create_tenant(body, session.admin_id, gw),
        notice=f"Tenant {body['id']} created.",
    )


@router.post("/tenants/{tenant_id}")
async def edit_tenant(
    tenant_id: str, console: ConsoleDep, session: SessionDep, form: FormDep, gw: GatewayDep
) -> Response:
    body = forms.tenant_body(form, create=False)
    return await perform(
        _tenant_page(console.pages.base, tenant_id),
        lambda: tenants_admin.change_tenant(gw, tenant_id, body, session.admin_id),
        notice="Tenant saved.",
    )


@router.post("/tenants/{tenant_id}/suspend")
async def suspend_tenant(
    tenant_id: str, console: ConsoleDep, session: SessionDep, _: FormDep, gw: GatewayDep
) -> Response:
    notice = "Tenant suspended: its requests are refused (403)."
    return await _set_suspended(tenant_id, console, session, gw, suspended=True, notice=notice)


@router.post("/tenants/{tenant_id}/resume")
async def resume_tenant(
    tenant_id: str, console: ConsoleDep, session: SessionDep, _: FormDep, gw: GatewayDep
) -> Response:
    return await _set_suspended(tenant_id, console, session, gw, suspended=False, notice="Tenant resumed.")


async def _set_suspended(
    tenant_id: str, console: ConsoleDep, session: SessionDep, gw: GatewayDep, *, suspended: bool, notice: str
) -> Response:
    """Suspend or resume the tenant (the admin API's change of its ``suspended`` field) and back to its page."""
    return await perform(
        _tenant_page(console.pages.base, tenant_id),
        lambda: tenants_admin.change_tenant(gw, tenant_id, {"suspended": suspended}, session.admin_id),
        notice=notice,
    )


@router.post("/tenants/{tenant_id}/keys")
async def create_key(
    tenant_id: str, console: ConsoleDep, session: SessionDep, form: FormDep, gw: GatewayDep
) -> Response:
    """Create a key and show its secret on this one page (not after a redirect: it is never shown again)."""
    key_id = form.get("key_id", "").strip() or None
    try:
        created = await admin.create_key(admin.CreateKey(tenant=tenant_id, key_id=key_id), session.admin_id, gw)
    except GatewayError as exc:
        return _back(_tenant_page(console.pages.base, tenant_id), error=exc.message)
    context = {**await tenant_context(gw, session.admin_id, tenant_id), "session": session, "new_key": created}
    response = console.pages.render("tenant.html.j2", context, title="Tenants", status_code=201)
    response.headers["cache-control"] = "no-store"
    return response


@router.post("/tenants/{tenant_id}/keys/{key_id}/revoke")
async def revoke_key(
    tenant_id: str, key_id: str, console: ConsoleDep, session: SessionDep, _: FormDep, gw: GatewayDep
) -> Response:
    return await perform(
        _tenant_page(console.pages.base, tenant_id),
        lambda: admin.revoke_key(key_id, session.admin_id, gw),
        notice=f"Key {key_id} revoked.",
    )


@router.post("/tiers/{tier}")
async def edit_tier(tier: str, console: ConsoleDep, session: SessionDep, form: FormDep, gw: GatewayDep) -> Response:
    body = forms.tier_body(form)
    return await perform(
        f"{console.pages.base}/tiers",
        lambda: tiers_admin.update_tier(tier, body, session.admin_id, gw),
        notice=f"Tier {tier} saved.",
    )


def _tenant_page(base: str, tenant_id: str) -> str:
    return f"{base}/tenants/{quote(tenant_id, safe='')}"
