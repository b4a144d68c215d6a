"""The ``Authorization: Bearer <secret>`` header, read and checked the same way by every gearshift server.

Used by the gateway (tenant keys, the admin key), the simulated worker and the real vLLM plugin (the control
token). The comparison is constant-time (``hmac.compare_digest``) so its timing reveals nothing of the secret.
"""

from __future__ import annotations

import hmac

SCHEME = "bearer"


def bearer_secret(authorization: str | None) -> str | None:
    """The secret of an ``Authorization: Bearer …`` header; ``None`` when the header is absent, names another
    scheme or carries an empty secret."""
    scheme, _, secret = (authorization or "").partition(" ")
    secret = secret.strip()
    if scheme.lower() != SCHEME or not secret:
        return None
    return secret


def bearer_matches(authorization: str | None, expected: str) -> bool:
    """Whether the header carries exactly ``expected`` (constant-time; an empty ``expected`` never matches)."""
    secret = bearer_secret(authorization)
    if secret is None or not expected:
        return False
    return hmac.compare_digest(secret.encode(), expected.encode())


def bearer_header(secret: str) -> dict[str, str]:
    """The request header that presents ``secret`` (for clients: the controller, the CLI, benchmarks)."""
    return {"Authorization": f"Bearer {secret}"}
