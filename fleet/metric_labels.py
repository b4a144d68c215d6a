"""The value a metric's ``tenant`` label carries (issue 23's security pass): the tenant id, or a stable salted
hash of it, so that whoever can read ``/metrics`` (a Prometheus, a dashboard viewer) does not learn which
tenants the fleet serves.

Every metric that labels a tenant, in the gateway and in the controller, takes its value from one
``TenantLabeler``; ``gearshift top`` and anything else that joins a metric to a tenant asks the same labeler for
the label of each tenant it knows, so the mapping is never stored anywhere.

The hash is ``t-`` and the first 16 hex digits (64 bits) of HMAC-SHA256 keyed with the key pepper
(``GEARSHIFT_KEY_PEPPER``, which every replica and the controller share), over a fixed domain tag and the id:
stable across processes and restarts, equal on every replica, and not computable from a guessed tenant id
without the pepper. Rotating the pepper changes every label (and every API-key digest).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Final, Literal

TenantLabelMode = Literal["id", "hash"]
"""``id``: the tenant id as the label; ``hash``: ``TenantLabeler.hashed`` of it."""

_DOMAIN: Final = b"gearshift-metrics-tenant\x00"
"""Separates these HMACs from the API-key digests made with the same pepper."""
_HEX_DIGITS: Final = 16


class TenantLabeler:
    """The ``tenant`` label of a tenant id under ``mode``; results are cached (the tenants are a bounded set)."""

    __slots__ = ("_cache", "_pepper", "mode")

    def __init__(self, mode: TenantLabelMode = "id", *, pepper: str = "") -> None:
        if mode == "hash" and not pepper:
            raise ValueError("a hashed tenant label needs the key pepper")
        self.mode: TenantLabelMode = mode
        self._pepper = pepper.encode()
        self._cache: dict[str, str] = {}

    def __call__(self, tenant_id: str) -> str:
        if self.mode == "id":
            return tenant_id
        found = self._cache.get(tenant_id)
        if found is None:
            found = self._cache[tenant_id] = self.hashed(tenant_id)
        return found

    def hashed(self, tenant_id: str) -> str:
        """``t-`` and 16 hex digits of HMAC-SHA256(pepper, domain tag + id)."""
        mac = hmac.new(self._pepper, _DOMAIN + tenant_id.encode(), hashlib.sha256)
        return "t-" + mac.hexdigest()[:_HEX_DIGITS]


PLAIN: Final = TenantLabeler()
"""The labeler that uses tenant ids as they are (the default)."""
