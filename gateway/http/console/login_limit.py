"""Failed console logins, rate limited per client address: after ``max_failures`` failures within ``window_s``
the address must wait until the oldest of them leaves the window. Successful logins are not counted. Kept in
this replica's memory (a guess costs a round trip to one replica; the admin keys themselves are long random
secrets), with at most ``max_clients`` addresses tracked."""

from __future__ import annotations

from collections import deque

from fleet.clock import Clock


class LoginLimiter:
    def __init__(self, *, clock: Clock, max_failures: int, window_s: float, max_clients: int = 10_000) -> None:
        self._clock = clock
        self.max_failures = max_failures
        self.window_s = window_s
        self._max_clients = max_clients
        self._failures: dict[str, deque[float]] = {}

    @property
    def tracked(self) -> int:
        """Addresses with failures remembered."""
        return len(self._failures)

    def retry_after(self, client: str) -> float:
        """Seconds ``client`` must wait before its next login attempt (0: it may try now)."""
        failures = self._recent(client)
        if len(failures) < self.max_failures:
            return 0.0
        return max(failures[0] + self.window_s - self._clock.monotonic(), 0.0)

    def failed(self, client: str) -> None:
        """Count a failed login of ``client``."""
        if client not in self._failures and len(self._failures) >= self._max_clients:
            self._forget_quiet()
        self._recent(client).append(self._clock.monotonic())

    def _recent(self, client: str) -> deque[float]:
        failures = self._failures.setdefault(client, deque(maxlen=self.max_failures))
        while failures and failures[0] <= self._clock.monotonic() - self.window_s:
            failures.popleft()
        return failures

    def _forget_quiet(self) -> None:
        """Drop the addresses with no failure left in the window (or, if none, the oldest tracked)."""
        now = self._clock.monotonic()
        quiet = [c for c, f in self._failures.items() if not f or f[-1] <= now - self.window_s]
        for client in quiet or [next(iter(self._failures))]:
            del self._failures[client]
