"""The console's templates (Jinja2, autoescaped) and the formats its pages share: USD, shares, milliseconds."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, cast

from fastapi import Request
from fastapi.routing import APIRoute
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.responses import HTMLResponse, Response

from fleet.clock import Clock
from gateway.errors import GatewayError

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
HTMX_VERSION = "2.0.11"
"""The vendored htmx (``static/htmx-<version>.min.js``, from npm's ``htmx.org``; licence 0BSD, ``static/``)."""
PAGES = ("Fleet", "Tenants", "Tiers", "Costs")
HEADERS = {
    "content-security-policy": (
        "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; form-action 'self'"
    ),
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}
"""Every page: scripts and forms from the console only, never framed, never cached (a new key's secret is on
one)."""


def usd(value: float | None) -> str:
    if value is None:
        return "—"
    return f"${value:,.4f}" if abs(value) < 1 else f"${value:,.2f}"


def pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}" if abs(value) >= 0.1 else f"{value:.1%}"


def ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.0f} ms"


def seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:g} s"


class Pages:
    """Renders the console's pages; ``base`` is the console's path prefix (``/console``)."""

    def __init__(self, *, base: str, clock: Clock) -> None:
        self.base = base
        self._clock = clock
        self._env = Environment(
            loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html", "j2"]), auto_reload=False
        )
        self._env.globals.update(usd=usd, pct=pct, ms=ms, seconds=seconds, when=self._when, ago=self._ago)

    def render(
        self, template: str, context: Mapping[str, Any], *, status_code: int = 200, title: str = ""
    ) -> HTMLResponse:
        """``template`` with ``context`` and what every page has: the nav, the static path and the errors."""
        full = {
            "title": title,
            "base": self.base,
            "static_url": f"{self.base}/static",
            "htmx_version": HTMX_VERSION,
            "nav": [(name, f"{self.base}/{name.lower()}") for name in PAGES],
            "errors": [],
            "notices": [],
            "session": None,
            **context,
        }
        html = self._env.get_template(template).render(full)
        return HTMLResponse(html, status_code=status_code, headers=HEADERS)

    def _when(self, unix_s: float) -> str:
        return datetime.datetime.fromtimestamp(unix_s, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

    def _ago(self, unix_s: float) -> str:
        return f"{max(self._clock.wall() - unix_s, 0.0):.0f} s"


class HtmlErrors(APIRoute):
    """A console route whose admin API errors (an unknown tenant, a refused value) answer as a page, with the
    error's status and message, instead of the API's JSON body."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except GatewayError as exc:
                pages = cast(Pages, request.app.state.console.pages)
                context = {"status": exc.status, "errors": [exc.message]}
                return pages.render("error.html.j2", context, status_code=exc.status, title="Error")

        return route
