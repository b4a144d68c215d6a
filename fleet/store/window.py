"""Rolling-window counter math shared by both stores (``store_memory`` runs it in Python, ``store_redis``
mirrors it line for line in Lua), so the two give identical answers for identical calls.

A window of ``window_s`` seconds is cut into ``BUCKETS_PER_WINDOW`` buckets of ``window_s / 100`` seconds;
a counter is a map bucket index → units (requests or tokens). A unit reserved at time t lands in bucket
``floor(t / width)`` and is counted until that bucket's end plus ``window_s``. So every true rolling window
``(now - window_s, now]`` is covered: the limit is never exceeded, and a unit is held at most one bucket
(1 % of the window) longer than exact, so utilisation is within 1 % of an exact sliding log while a check
costs at most 101 counters instead of one entry per request.

Refunds (negative corrections) are taken oldest bucket first, never from buckets newer than the
reservation's, and never below zero: a refund can only make the counter more conservative, never let
more through than an exact log of the final costs would.
"""

from __future__ import annotations

import math
from collections.abc import MutableMapping

BUCKETS_PER_WINDOW = 100
SLOT_RETRY_AFTER_S = 1.0
"""Retry-After for a refused concurrency slot, seconds: slots free when requests end, which we cannot predict."""


def bucket_width(window_s: float) -> float:
    """Seconds per bucket."""
    return window_s / BUCKETS_PER_WINDOW


def bucket_of(t: float, window_s: float) -> int:
    """Index of the bucket holding time ``t`` (Unix s)."""
    return math.floor(t / bucket_width(window_s))


def bucket_expiry(index: int, window_s: float) -> float:
    """When bucket ``index`` stops counting, Unix s."""
    return (index + 1) * bucket_width(window_s) + window_s


def prune(buckets: MutableMapping[int, int], *, window_s: float, now: float) -> None:
    """Drop buckets that no longer count at ``now``. Cheap when none has expired: the oldest bucket expires
    first, so the full scan runs only once it has."""
    if not buckets or bucket_expiry(min(buckets), window_s) > now:
        return
    for index in [i for i in buckets if bucket_expiry(i, window_s) <= now]:
        del buckets[index]


def retry_after(
    buckets: MutableMapping[int, int], *, cost: int, limit: int, window_s: float, now: float
) -> float | None:
    """None when ``cost`` more units fit under ``limit`` at ``now``; else seconds until they would fit.

    A cost above the limit itself can never fit; it gets ``window_s``. ``buckets`` must be pruned.
    """
    used = sum(buckets.values())
    need = used + cost - limit
    if need <= 0:
        return None
    if cost > limit:
        return window_s
    freed = 0
    for index in sorted(buckets):
        freed += buckets[index]
        if freed >= need:
            return bucket_expiry(index, window_s) - now
    return window_s  # unreachable while ``cost <= limit``


def reserve(buckets: MutableMapping[int, int], *, cost: int, window_s: float, now: float) -> None:
    """Count ``cost`` units (> 0) at ``now``."""
    if cost > 0:
        index = bucket_of(now, window_s)
        buckets[index] = buckets.get(index, 0) + cost


def refund(
    buckets: MutableMapping[int, int], *, amount: int, window_s: float, now: float, reserved_at: float | None
) -> None:
    """Remove up to ``amount`` (> 0) units, oldest bucket first, from buckets no newer than ``reserved_at``'s
    (every live bucket when it is None). ``buckets`` must be pruned."""
    newest = bucket_of(reserved_at if reserved_at is not None else now, window_s)
    for index in sorted(buckets):
        if amount <= 0 or index > newest:
            break
        take = min(buckets[index], amount)
        amount -= take
        if take == buckets[index]:
            del buckets[index]
        else:
            buckets[index] -= take
