"""Console sessions: the admin key is exchanged once for a short-lived signed session token (the cookie), and
every form carries a CSRF token bound to that session.

A token is ``<admin id>.<expiry>.<nonce>.<mac>``: HMAC-SHA256 over the first three parts, keyed by the admin
key it was issued for. Nothing is stored (every replica verifies any replica's token); changing or removing an
admin key ends its sessions at once. Logout forgets the nonce on this replica until the token would expire
(``SessionSigner.revoke``); other replicas honour the cookie until its expiry, which is why sessions are short.
The CSRF token is a second MAC over the nonce: a page served to the session holds it, a cross-site form cannot.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fleet.clock import Clock

COOKIE = "gearshift_console"
CSRF_FIELD = "csrf"
_SESSION = b"gearshift-console-session"
_CSRF = b"gearshift-console-csrf"


@dataclass(frozen=True, slots=True)
class Session:
    """A verified session: the admin key id it acts as (the audit trail's ``who``) and its CSRF token."""

    admin_id: str
    expires_at: float
    """Unix seconds."""
    nonce: str
    csrf: str


class SessionSigner:
    """Issues and verifies session tokens for the admin keys ``credentials()`` returns (id → key)."""

    def __init__(self, credentials: Callable[[], Mapping[str, str]], *, clock: Clock, ttl_s: float) -> None:
        self._credentials = credentials
        self._clock = clock
        self.ttl_s = ttl_s
        self._revoked: dict[str, float] = {}
        """Nonces logged out on this replica → their expiry (Unix s), dropped once expired."""

    def login(self, presented: str) -> tuple[str, Session] | None:
        """The token and session for the admin key ``presented`` (constant-time match), or None."""
        matched = [
            key_id
            for key_id, key in self._credentials().items()
            if key and hmac.compare_digest(presented.encode(), key.encode())
        ]
        if not matched:
            return None
        admin_id = matched[0]
        expires = int(self._clock.wall() + self.ttl_s)
        payload = f"{admin_id}.{expires}.{secrets.token_urlsafe(16)}"
        token = f"{payload}.{self._mac(_SESSION, admin_id, payload)}"
        session = self.verify(token)
        assert session is not None
        return token, session

    def verify(self, token: str | None) -> Session | None:
        """The session of a token that is well formed, signed by its admin key, unexpired and not logged out."""
        parts = (token or "").split(".")
        if len(parts) != 4:
            return None
        admin_id, expiry, nonce, mac = parts
        if not self._credentials().get(admin_id) or not expiry.isdigit():
            return None  # an id without a key (or with an empty one) signs nothing: anyone could forge its MAC
        payload = f"{admin_id}.{expiry}.{nonce}"
        if not hmac.compare_digest(mac, self._mac(_SESSION, admin_id, payload)):
            return None
        now = self._clock.wall()
        if int(expiry) <= now or nonce in self._revoked:
            return None
        return Session(admin_id, float(expiry), nonce, self._mac(_CSRF, admin_id, nonce))

    def csrf_ok(self, session: Session, presented: str | None) -> bool:
        """Whether a form's CSRF token is the session's (constant-time)."""
        return presented is not None and hmac.compare_digest(presented.encode(), session.csrf.encode())

    def revoke(self, session: Session) -> None:
        """Log ``session`` out on this replica."""
        now = self._clock.wall()
        self._revoked = {n: exp for n, exp in self._revoked.items() if exp > now}
        self._revoked[session.nonce] = session.expires_at

    def _mac(self, purpose: bytes, admin_id: str, message: str) -> str:
        key = self._credentials().get(admin_id, "")
        return hmac.new(purpose + b"\0" + key.encode(), message.encode(), hashlib.sha256).hexdigest()
