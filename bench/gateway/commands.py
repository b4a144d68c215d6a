"""What a gateway target sends the bench's Redis: the round trips counted by ``INFO commandstats`` during the timed
runs, and, in a short run of its own, the command mix by name (``MONITOR``: the top-level commands, each script call
named by the gearshift script it runs).

Why two: ``INFO commandstats`` costs nothing while wrk runs, but it counts every command a script runs inside Redis
beside the script call itself, and cannot tell one script from another; ``MONITOR`` can, but it slows Redis down, so
it runs after the timed cells, never during them.
"""

from __future__ import annotations

import collections
import hashlib
import socket
import threading
import uuid
from dataclasses import dataclass, field
from types import TracebackType

ROUND_TRIP_COMMANDS = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_exec")
"""What the gateway sends Redis on the request path: Lua scripts (admit, settle, ledger append, the bundles of rides)
and transactions. ``INFO commandstats`` also counts every command a script runs inside Redis, so a sum over all
commands would count one EVALSHA as 5-20; plain commands outside scripts (a few per second of background reads) are
left out too."""


def redis_commands(url: str) -> int:
    """Scripts and transactions the Redis at ``url`` has run so far (``INFO commandstats``): the gateway's calls."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        stats: dict[str, dict[str, int]] = client.info("commandstats")
    finally:
        client.close()
    return sum(int(stats[k]["calls"]) for k in ROUND_TRIP_COMMANDS if k in stats)


def script_names() -> dict[str, str]:
    """SHA1 of each script of ``fleet.store.lua`` → its name in lower case (``admit``, ``bundle``, ...)."""
    from fleet.store import lua

    return {
        hashlib.sha1(text.encode()).hexdigest(): name.lower()
        for name, text in vars(lua).items()
        if name.isupper() and isinstance(text, str) and "redis.call" in text
    }


def command_name(line: bytes, scripts: dict[str, str]) -> str | None:
    """The name of the top-level command of one ``MONITOR`` line (``EVALSHA`` as ``evalsha:<script>``), None for a
    command a script ran (``[0 lua]``) or a line that is not a command."""
    if not line.startswith(b"+") or b" lua]" in line:
        return None
    parts = line.split(b'"')
    if len(parts) < 2:
        return None
    name = parts[1].decode(errors="replace").lower()
    if name == "evalsha" and len(parts) > 3:
        return "evalsha:" + scripts.get(parts[3].decode(errors="replace"), "other")
    if name == "eval":
        return "eval"
    return name


@dataclass
class Monitor:
    """A ``MONITOR`` connection to ``127.0.0.1:port`` counting top-level commands by name while it is open (a
    context manager; ``counts`` is final on exit)."""

    port: int
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    _end: bytes = field(default_factory=lambda: f"gearshift-monitor-end-{uuid.uuid4().hex}".encode())
    """What the last command (``ECHO``, sent on exit) carries: every command before it has been counted once the
    feed shows it."""
    _thread: threading.Thread | None = None
    _sock: socket.socket | None = None

    def __enter__(self) -> Monitor:
        self._sock = socket.create_connection(("127.0.0.1", self.port), timeout=5.0)
        self._sock.sendall(b"MONITOR\r\n")
        self._thread = threading.Thread(target=self._read, args=(self._sock, script_names()), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=5.0) as end:
                end.sendall(b"*2\r\n$4\r\nECHO\r\n$%d\r\n%s\r\n" % (len(self._end), self._end))
                end.recv(1024)
        except OSError:
            pass  # Redis is gone: the feed ends with the connection
        if self._thread is not None:
            self._thread.join(timeout=10.0)
        if self._sock is not None:
            self._sock.close()
        for own in ("monitor", "info"):  # this connection's and the bench's own
            self.counts.pop(own, None)

    def _read(self, sock: socket.socket, scripts: dict[str, str]) -> None:
        rest = b""
        sock.settimeout(15.0)
        while True:
            try:
                data = sock.recv(1 << 20)
            except OSError:  # closed, or no command for 15 s
                return
            if not data:
                return
            *lines, rest = (rest + data).split(b"\r\n")
            for line in lines:
                if self._end in line:
                    return
                name = command_name(line, scripts)
                if name is not None:
                    self.counts[name] += 1
