"""Build the ``Store`` the settings ask for: Redis (or Redis Cluster) when ``redis_url`` is set, else process memory."""

from __future__ import annotations

from fleet.clock import Clock, SystemClock
from fleet.config import CommonSettings
from fleet.store.memory import MemoryStore
from fleet.store.protocol import Store
from fleet.store.redis import RedisStore, sentinel_addresses


def build_store(settings: CommonSettings, *, clock: Clock | None = None) -> Store:
    """A ``RedisStore`` on ``settings.redis_url`` with ``settings.key_prefix`` (a cluster client when
    ``settings.redis_cluster``, the Sentinels' primary when ``settings.redis_sentinels``), or a ``MemoryStore`` on
    ``clock``.

    The caller owns the result and must ``await store.close()``. No connection is made until first use.
    """
    if settings.redis_url and settings.redis_sentinels:
        return RedisStore.from_sentinels(
            sentinel_addresses(settings.redis_sentinels),
            master=settings.redis_sentinel_master,
            url=settings.redis_url,
            prefix=settings.key_prefix,
            wait_replicas=settings.redis_wait_replicas,
        )
    if settings.redis_url:
        return RedisStore.from_url(
            settings.redis_url,
            prefix=settings.key_prefix,
            cluster=settings.redis_cluster,
            wait_replicas=settings.redis_wait_replicas,
        )
    return MemoryStore(clock=clock or SystemClock())
