"""The operator's console (``/console``): fleet, tenants, tiers and costs in a browser, served by the gateway's
admin side.

Server-rendered HTML (Jinja2) with a vendored, pinned htmx (``static/``) and no build step. It reads and writes
only through the admin API's own functions (``reads``, ``actions``), so a change made here is validated,
stored and audited exactly as one made with ``/admin/v1`` or the CLI; the console writes nothing to the store
itself. Sign-in exchanges an admin key for a short-lived session cookie (``session``); every form carries the
session's CSRF token; failed logins are rate limited (``login_limit``). It is mounted only with the admin API,
when ``console_enabled`` is set and an admin key is configured.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles

from fleet.clock import Clock
from gateway.http.console import actions, auth, pages
from gateway.http.console.door import ConsoleDoor
from gateway.http.console.login_limit import LoginLimiter
from gateway.http.console.render import STATIC, Pages
from gateway.http.console.session import SessionSigner
from gateway.settings import GatewaySettings

BASE = "/console"


def install(app: FastAPI, settings: GatewaySettings, *, clock: Clock) -> bool:
    """Mount the console on ``app`` when it is enabled and the admin API has a key; whether it was mounted."""
    if not settings.console_enabled or not any(settings.admin_credentials().values()):
        return False
    signer = SessionSigner(settings.admin_credentials, clock=clock, ttl_s=settings.console_session_ttl_s)
    app.state.console = auth.Console(
        signer=signer,
        limiter=LoginLimiter(
            clock=clock, max_failures=settings.console_login_failures, window_s=settings.console_login_window_s
        ),
        pages=Pages(base=BASE, clock=clock),
        door=ConsoleDoor(BASE, signer),
    )
    for part in (auth.router, pages.router, actions.router):
        app.include_router(part, prefix=BASE, include_in_schema=False)
    app.mount(f"{BASE}/static", StaticFiles(directory=STATIC), name="console-static")
    app.add_exception_handler(auth.LoginRequired, _to_login)
    app.add_exception_handler(auth.CsrfRefused, _csrf_refused)
    return True


async def _to_login(request: Request, exc: Exception) -> Response:
    """No live session: to the login page (an htmx request is told to navigate there)."""
    if request.headers.get("hx-request"):
        return Response(status_code=204, headers={"hx-redirect": f"{BASE}/login"})
    return RedirectResponse(f"{BASE}/login", status_code=303)


async def _csrf_refused(request: Request, exc: Exception) -> Response:
    return HTMLResponse("<h1>403</h1><p>This form is missing its CSRF token, or it is not this session's.</p>", 403)
