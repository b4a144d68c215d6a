"""The admin API's door (issue 23): every ``/admin/`` request is authenticated here, in the ASGI entry
(``gateway.http.entry``), before its body is read, and failed attempts are rate limited per client address.

A client address with ``failures`` failed attempts within ``window_s`` is answered 429 with ``Retry-After`` until the
oldest of them leaves the window, and nothing it presents is checked meanwhile: a guess cannot be told apart from
the right key while blocked. The address is the TCP peer's: behind a proxy every client shares the proxy's address
(put the admin API on its own listener or network there; see docs/operations/outages.md). Memory is bounded: at
most ``max_clients`` addresses are remembered (the one seen longest ago goes first).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Mapping

from fleet.bearer import bearer_matches
from fleet.clock import Clock
from gateway.errors import AuthenticationFailed, RateLimited
from gateway.intake.auth import presented_secret

ADMIN_PREFIX = "/admin/"
ADMIN_ID = "admin_id"
"""Key of the authorised admin key's id in the ASGI scope's ``state`` (``gateway.http.deps.require_admin``)."""


class AdminGuard:
    """Checks admin keys (each compared in constant time) and counts the failures of each client address."""

    def __init__(
        self,
        credentials: Callable[[], Mapping[str, str]],
        *,
        clock: Clock,
        failures: int,
        window_s: float = 60.0,
        max_clients: int = 10_000,
    ) -> None:
        """``credentials``: admin key id → key (``GatewaySettings.admin_credentials``)."""
        self._credentials = credentials
        self._clock = clock
        self._failures = failures
        self._window_s = window_s
        self._max_clients = max_clients
        self._failed: OrderedDict[str, deque[float]] = OrderedDict()
        """Client address → monotonic times of its failed attempts within the window, oldest first."""

    def authorize(self, authorization: str | None, client: str) -> str:
        """The id of the admin key presented; ``AuthenticationFailed`` (401) for a missing, malformed or wrong key,
        ``RateLimited`` (429) for a client that failed too often."""
        now = self._clock.monotonic()
        recent = self._recent(client, now)
        if recent is not None and len(recent) >= self._failures:
            retry = recent[0] + self._window_s - now
            raise RateLimited(
                f"Too many failed admin authentications from this address; retry after {retry:.0f} s.",
                limit="admin_auth",
                retry_after_s=retry,
            )
        try:
            presented_secret(authorization)  # 401 for a missing or malformed header, with its own message
            matched = [i for i, key in self._credentials().items() if bearer_matches(authorization, key)]
            if not matched:
                raise AuthenticationFailed("Incorrect admin key.")
        except AuthenticationFailed:
            self._record_failure(client, now)
            raise
        return matched[0]

    def _recent(self, client: str, now: float) -> deque[float] | None:
        times = self._failed.get(client)
        if times is None:
            return None
        while times and times[0] <= now - self._window_s:
            times.popleft()
        if not times:
            del self._failed[client]
            return None
        return times

    def _record_failure(self, client: str, now: float) -> None:
        times = self._failed.setdefault(client, deque())
        times.append(now)
        self._failed.move_to_end(client)
        while len(self._failed) > self._max_clients:
            self._failed.popitem(last=False)
