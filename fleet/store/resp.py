"""A lean pipelined Redis connection for the gateway's hot scripts (admit, settle): one socket, commands written as
they come, replies matched in order (RESP2, parsed by hiredis).

Why beside redis-py: redis-py's asyncio client spends several hundred microseconds of CPU per command (a connection
taken from and returned to the pool, retry and deprecation wrappers, per-call argument checks and response
callbacks); measured on this 2-core machine, an admit EVALSHA cost ~500-800 µs of CPU through it and ~130-160 µs
through this connection, under the same load. At c=1 that CPU is on every request's path. Concurrent callers share
the socket: their commands are pipelined for free.

Scope: a plain single Redis (``redis://`` with optional user, password and database). Cluster, Sentinel and TLS
stay on redis-py. A connection that is lost (Redis restarted, network) fails the commands in flight with
``ConnectionError`` (a command may have run: the caller's failure mode decides, as for any store error) and the next
command reconnects; a command issued while no connection exists waits for the reconnect, and a connect that fails
raises at once. A caller cancelled while waiting for its reply leaves the reply to be read and dropped in order.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError


def _encode(args: Sequence[object]) -> bytes:
    """One command in RESP (hiredis packs it in C: a third of the CPU of doing it here, per command)."""
    packed: bytes = hiredis.pack_command(tuple(args))  # type: ignore[arg-type]  # its stub types a 1-tuple
    return packed


def _error(reply: hiredis.ReplyError) -> ResponseError:
    message = str(reply)
    return NoScriptError(message) if message.startswith("NOSCRIPT") else ResponseError(message)


def as_error(reply: Any) -> Any:
    """``reply`` with an error reply nested in an array (hiredis's ``ReplyError``) as redis-py's ``ResponseError``,
    which redis-py's own parser gives: one kind of error whichever connection read it."""
    return _error(reply) if isinstance(reply, hiredis.ReplyError) else reply


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.reader = hiredis.Reader(encoding="utf-8")
        self.waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.transport: asyncio.WriteTransport | None = None
        self.lost: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.WriteTransport, transport)  # uvloop's TCPTransport is not an asyncio.Transport

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            future = self.waiting.popleft()
            if future.done():  # its caller was cancelled
                continue
            if isinstance(reply, hiredis.ReplyError):
                future.set_exception(_error(reply))
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = RedisConnectionError(f"connection to Redis lost: {exc or 'closed by the server'}")
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(self.lost)

    def send(self, payload: bytes, replies: int) -> list[asyncio.Future[Any]]:
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(replies)]
        self.waiting.extend(futures)
        self.transport.write(payload)
        return futures


class RespConnection:
    """One lazily opened connection to the Redis at ``url`` (``redis://[user:password@]host:port/db``)."""

    def __init__(self, url: str, *, connect_timeout_s: float = 5.0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "redis":
            raise ValueError(f"RespConnection serves redis:// URLs only, not {parts.scheme}://")
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 6379
        self._user = unquote(parts.username) if parts.username else None
        self._password = unquote(parts.password) if parts.password else None
        path = parts.path.lstrip("/")
        self._db = int(path) if path else 0
        self._timeout_s = connect_timeout_s
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Lock | None = None

    async def _connected(self) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and protocol.lost is None:
            return protocol
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._protocol is None or self._protocol.lost is not None:
                self._protocol = await self._open()
            return self._protocol

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout_s):
                _, protocol = await loop.create_connection(_Protocol, self._host, self._port)
        except (OSError, TimeoutError) as exc:
            raise RedisConnectionError(f"cannot connect to Redis at {self._host}:{self._port}: {exc!r}") from exc
        hello: list[list[object]] = []
        if self._password is not None:
            hello.append(["AUTH", self._user, self._password] if self._user else ["AUTH", self._password])
        if self._db:
            hello.append(["SELECT", self._db])
        if hello:
            futures = protocol.send(b"".join(_encode(c) for c in hello), len(hello))
            await asyncio.gather(*futures)
        return protocol

    async def call(self, *args: object) -> Any:
        """Run one command; its reply (an error reply raised as redis-py's ``ResponseError`` / ``NoScriptError``)."""
        protocol = await self._connected()
        (future,) = protocol.send(_encode(args), 1)
        return await future

    async def pipeline(self, commands: Sequence[Sequence[object]]) -> list[Any]:
        """Run ``commands`` in one write; their replies in order, an error reply (or a lost connection) in its place
        as the exception."""
        protocol = await self._connected()
        futures = protocol.send(b"".join(_encode(c) for c in commands), len(commands))
        return list(await asyncio.gather(*futures, return_exceptions=True))

    async def close(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()
