"""The console's door in the ASGI entry (``gateway.http.entry``, issue 23 security pass): the console changes
tenants as the admin API does, so it is guarded as the admin API is. A console request's body is read only within
``GEARSHIFT_MAX_ADMIN_BODY_BYTES``, and only for the login form (which carries the admin key, and whose failures
``gateway.http.console.login_limit`` limits) or with a live session cookie; without one the body is never read and
the route answers with the login page."""

from __future__ import annotations

from http.cookies import CookieError, SimpleCookie

from starlette.types import Scope

from gateway.http.console.session import COOKIE, SessionSigner


class ConsoleDoor:
    """Which console requests may have their body read, before anything parses it."""

    def __init__(self, base: str, signer: SessionSigner) -> None:
        self._prefix = base.rstrip("/") + "/"
        self._login = self._prefix + "login"
        self._signer = signer

    def guards(self, path: str) -> bool:
        """Whether ``path`` is the console's (its body then has the admin API's cap)."""
        return path.startswith(self._prefix)

    def may_read_body(self, scope: Scope) -> bool:
        """The login form's, or a request with a live session cookie."""
        if scope["path"] == self._login:
            return True
        return self._signer.verify(_cookie(scope, COOKIE)) is not None


def _cookie(scope: Scope, name: str) -> str | None:
    """The request's cookie ``name``, if any (from every ``Cookie`` header)."""
    for key, value in scope["headers"]:
        if key == b"cookie":
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except CookieError:  # a malformed header carries no session
                continue
            if name in jar:
                return jar[name].value
    return None
