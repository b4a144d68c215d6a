"""The console's sign-in: the admin key for a session cookie, logout, the failed-login limit, and the two
dependencies every page and form goes through (a live session; on a form, its CSRF token)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, cast

from fastapi import APIRouter, Depends, Request
from starlette.responses import RedirectResponse, Response

from gateway.http.console.door import ConsoleDoor
from gateway.http.console.forms import parse_form
from gateway.http.console.login_limit import LoginLimiter
from gateway.http.console.render import Pages
from gateway.http.console.session import COOKIE, CSRF_FIELD, Session, SessionSigner


@dataclass(frozen=True, slots=True)
class Console:
    """The console's own parts, built with the app (``install``) and kept in ``app.state.console``."""

    signer: SessionSigner
    limiter: LoginLimiter
    pages: Pages
    door: ConsoleDoor
    """Whose body the ASGI entry may read (``gateway.http.console.door``)."""


class LoginRequired(Exception):
    """No live session: the console answers with the login page (``install`` maps it)."""


class CsrfRefused(Exception):
    """A form without its session's CSRF token: refused with a 403 (``install`` maps it)."""


async def get_console(request: Request) -> Console:
    return cast(Console, request.app.state.console)


ConsoleDep = Annotated[Console, Depends(get_console)]


async def require_session(request: Request, console: ConsoleDep) -> Session:
    session = console.signer.verify(request.cookies.get(COOKIE))
    if session is None:
        raise LoginRequired
    return session


SessionDep = Annotated[Session, Depends(require_session)]
"""A live session; its ``admin_id`` is who the audit trail names for every change made through it."""


async def checked_form(request: Request, console: ConsoleDep, session: SessionDep) -> dict[str, str]:
    """The posted form, once its CSRF token matched the session's."""
    form = parse_form(await request.body())
    if not console.signer.csrf_ok(session, form.get(CSRF_FIELD)):
        raise CsrfRefused
    return form


FormDep = Annotated[dict[str, str], Depends(checked_form)]

router = APIRouter()


@router.get("/login")
async def login_page(console: ConsoleDep) -> Response:
    return _login(console)


def _login(console: Console, *, error: str | None = None, status_code: int = 200) -> Response:
    context = {"ttl_min": round(console.signer.ttl_s / 60), "errors": [error] if error else []}
    return console.pages.render("login.html.j2", context, title="Log in", status_code=status_code)


@router.post("/login")
async def login(request: Request, console: ConsoleDep) -> Response:
    """Exchange the admin key for a session cookie; each failure counts against the client's address."""
    client = request.client.host if request.client else "unknown"
    wait = console.limiter.retry_after(client)
    if wait > 0:
        response = _login(console, error=f"Too many failed logins: try again in {wait:.0f} s.", status_code=429)
        response.headers["retry-after"] = str(max(int(wait), 1))
        return response
    issued = console.signer.login(parse_form(await request.body()).get("admin_key", ""))
    if issued is None:
        console.limiter.failed(client)
        return _login(console, error="Incorrect admin key.", status_code=401)
    token, _ = issued
    response = RedirectResponse(f"{console.pages.base}/fleet", status_code=303)
    response.set_cookie(
        COOKIE,
        token,
        max_age=int(console.signer.ttl_s),
        path=console.pages.base,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
async def logout(console: ConsoleDep, session: SessionDep, _: FormDep) -> Response:
    console.signer.revoke(session)
    response = RedirectResponse(f"{console.pages.base}/login", status_code=303)
    response.delete_cookie(COOKIE, path=console.pages.base, httponly=True, samesite="strict")
    return response
