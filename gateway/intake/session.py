"""The client's session, for the ledger: ``x-gearshift-session`` names the conversation a request belongs to, so
a replay of the ledger (``gearshift bench replay``) sends a session's turns closed-loop, each after the previous
answer, instead of at fixed times. Routing ignores it."""

from __future__ import annotations

import re

from gateway.errors import InvalidRequest

SESSION_HEADER = b"x-gearshift-session"
_SESSION = re.compile(r"^[\x21-\x7e]{1,128}$")


def request_session(header: str | None) -> str | None:
    """The request's session id (None without the header). A value that is not 1–128 visible ASCII characters
    is refused (400)."""
    if header is None:
        return None
    if not _SESSION.match(header):
        message = f"'x-gearshift-session' must be 1-128 visible ASCII characters; got {header[:80]!r}."
        raise InvalidRequest(message, param="x-gearshift-session")
    return header
