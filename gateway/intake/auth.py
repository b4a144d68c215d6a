"""Authentication: ``Authorization: Bearer <key>`` → keyed digest → tenant.

The presented secret is never stored or compared directly: it is turned into ``hmac-sha256(pepper, secret)``
and that digest is looked up, first among the tenants file's keys, then among the keys created at run time
(kept in the store, cached here for ``key_cache_ttl_s``). Because the digest is keyed with a secret pepper, the
timing of the lookup reveals nothing an attacker can steer; the final equality check is ``hmac.compare_digest``.
"""

from __future__ import annotations

import hmac
from collections import OrderedDict
from dataclasses import dataclass

from fleet import bearer
from fleet.clock import Clock
from fleet.config import TenantConfig, TenantsConfig, TierConfig, key_digest
from fleet.store.protocol import Store
from gateway.errors import AuthenticationFailed, StoreUnavailable, TenantSuspended
from gateway.settings import GatewaySettings


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller."""

    tenant: TenantConfig
    tier_name: str
    tier: TierConfig
    key_id: str


def presented_secret(authorization: str | None) -> str:
    """The secret of an ``Authorization: Bearer …`` header; ``AuthenticationFailed`` when it is absent
    (``missing_api_key``) or malformed."""
    if not authorization:
        raise AuthenticationFailed("Missing API key: send 'Authorization: Bearer <key>'.", code="missing_api_key")
    secret = bearer.bearer_secret(authorization)
    if secret is None:
        raise AuthenticationFailed("Malformed Authorization header: expected 'Bearer <key>'.")
    return secret


class KeyRing:
    """Resolves API keys to principals from the tenants file and the store's run-time keys."""

    def __init__(
        self,
        tenants: TenantsConfig,
        store: Store,
        *,
        pepper: str,
        clock: Clock,
        cache_ttl_s: float,
        cache_size: int = 4096,
    ) -> None:
        self._store = store
        self._pepper = pepper
        self._clock = clock
        self._ttl = cache_ttl_s
        self._size = cache_size
        self._cache: OrderedDict[str, tuple[float, tuple[str, str] | None]] = OrderedDict()
        self.use(tenants)

    @classmethod
    def from_settings(cls, tenants: TenantsConfig, store: Store, *, clock: Clock, settings: GatewaySettings) -> KeyRing:
        return cls(tenants, store, pepper=settings.key_pepper.get_secret_value(), clock=clock,
                   cache_ttl_s=settings.key_cache_ttl_s)  # fmt: skip

    def use(self, tenants: TenantsConfig) -> None:
        """Serve ``tenants`` from now on (the tenants in force changed at run time: ``gateway.intake.tenant_book``)."""
        self._tenants = tenants
        self._static: dict[str, tuple[str, str]] = {k.digest: (t.id, k.id) for t in tenants.tenants for k in t.keys}
        self._principals: dict[tuple[str, str], Principal] = {}
        """Built once per key while these tenants are in force (the set of keys is bounded)."""

    def digest(self, secret: str) -> str:
        return key_digest(secret, pepper=self._pepper)

    def principal(self, tenant_id: str, key_id: str) -> Principal:
        found = self._principals.get((tenant_id, key_id))
        if found is not None:
            return found
        tenant = self._tenants.tenant(tenant_id)
        if tenant is None:
            raise AuthenticationFailed("This API key belongs to a tenant that no longer exists.")
        if tenant.suspended:
            raise TenantSuspended(
                f"Tenant '{tenant_id}' is suspended: its requests are refused until an operator resumes it."
            )
        found = Principal(tenant=tenant, tier_name=tenant.tier, tier=self._tenants.tiers[tenant.tier], key_id=key_id)
        self._principals[(tenant_id, key_id)] = found
        return found

    async def authenticate(self, authorization: str | None) -> Principal:
        """The principal of a Bearer header; raises ``AuthenticationFailed`` for a missing, unknown or revoked key."""
        digest = self.digest(presented_secret(authorization))
        found = self._static.get(digest)
        if found is None:
            found = await self._runtime(digest)
        if found is None:
            raise AuthenticationFailed("Incorrect API key provided.")
        return self.principal(*found)

    async def _runtime(self, digest: str) -> tuple[str, str] | None:
        now = self._clock.monotonic()
        hit = self._cache.get(digest)
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            record = await self._store.api_key_by_digest(digest)
        except Exception as exc:  # the store is away: a key seen before keeps working, an unknown one waits
            if hit is not None:
                return hit[1]
            raise StoreUnavailable(f"Cannot verify the API key: the shared store failed ({exc!r}).") from None
        found = None
        if record is not None and not record.revoked and hmac.compare_digest(record.digest, digest):
            found = (record.tenant, record.key_id)
        self._cache[digest] = (now + self._ttl, found)
        self._cache.move_to_end(digest)
        while len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return found

    def forget(self, digest: str) -> None:
        """Drop a cached lookup (after a revocation through this replica)."""
        self._cache.pop(digest, None)
