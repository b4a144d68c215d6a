"""uvicorn's httptools HTTP/1.1 protocol with limits on the request head.

uvicorn bounds neither the size nor the number of request headers, nor the time a client may take to send
them, so one slow or hostile client can hold a connection (and its memory) forever. This protocol counts the
head as it is parsed and answers ``431`` with an OpenAI error body beyond ``max_header_bytes`` or
``max_headers``, and closes a connection whose head is not complete ``header_timeout_s`` after it began (or
after the connection opened). The timer is armed only for a head that one read leaves incomplete (and once per
connection, at its start): a keep-alive request whose head arrives whole, nearly all of them, arms none. The rest
of the request is uvicorn's.

Neither timer closes a connection on which the client's bytes already wait unread: uvloop runs due timers before it
reads the sockets, so a loop that ran late (a loaded machine) closed, unread, a request that had arrived in time (a
head within ``header_timeout_s`` of the connection's opening, a request within the keep-alive of the last response),
and its client got no response at all (the soak's transport errors, issue 23). The check costs one ``ioctl`` when a
timer fires, nothing per request.
"""

from __future__ import annotations

import asyncio
import fcntl
import struct
import termios
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.errors import HeadersTooLarge, render
from gateway.settings import GatewaySettings


class _HeadTooLarge(Exception):
    """Raised inside a parser callback to stop parsing; httptools reports it as a parser error."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """Set by ``guarded_protocol`` from the settings of the same names (which hold their defaults)."""

    max_header_bytes: int
    max_headers: int
    header_timeout_s: float

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_bytes = 0
        self._headers_seen = 0
        self._head_pending = 0
        self._rejection: str | None = None
        self._in_head = True
        self._head_began = self.loop.time()
        self._head_timer: asyncio.TimerHandle | None = self.loop.call_later(self.header_timeout_s, self._head_timeout)

    def timeout_keep_alive_handler(self) -> None:
        if _unread_bytes(self.transport):  # a request arrived before the timer ran: reading it cancels the timer
            return
        super().timeout_keep_alive_handler()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():
            self._head_pending += len(data)  # bytes of a head still incomplete: the parser buffers them
            if self._head_pending > self.max_header_bytes:
                self._reject(f"The request head exceeds {self.max_header_bytes} bytes.")
            elif self._head_timer is None:  # the head goes on in a later read: time it from its start
                self._head_timer = self.loop.call_at(self._head_began + self.header_timeout_s, self._head_timeout)

    # ------------------------------------------------------------------------------------- parser callbacks
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = self._headers_seen = 0
        self._in_head = True
        self._head_began = self.loop.time()  # a head read whole arms no timer (``data_received``: one left incomplete)

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers_seen += 1
        if self._headers_seen > self.max_headers:
            self._rejection = f"The request has more than {self.max_headers} headers."
            raise _HeadTooLarge(self._rejection)
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_pending = 0
        self._cancel_head_timer()
        super().on_headers_complete()

    # ------------------------------------------------------------------------------------------- refusals
    def _count(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > self.max_header_bytes:
            self._rejection = f"The request head exceeds {self.max_header_bytes} bytes."
            raise _HeadTooLarge(self._rejection)

    def send_400_response(self, msg: str) -> None:
        if self._rejection is None:
            super().send_400_response(msg)
        else:
            self._reject(self._rejection)

    def _reject(self, message: str) -> None:
        """Answer 431 with an OpenAI error body and close the connection."""
        self._cancel_head_timer()
        body = render(HeadersTooLarge(message))
        head = (
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head + body)
        self.transport.close()

    def _head_timeout(self) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing():
            return
        if _unread_bytes(self.transport):  # the client was in time, this loop was late: read what it sent first
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)
            return
        self.transport.close()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None


def _unread_bytes(transport: asyncio.Transport) -> int:
    """Bytes received on ``transport``'s socket and not yet read (0 when it cannot tell)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        count: int = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
    except (OSError, ValueError):
        return 0
    return count


def guarded_protocol(settings: GatewaySettings) -> type[GuardedHttpToolsProtocol]:
    """The protocol class with ``settings``' limits (uvicorn instantiates the class it is given)."""
    limits: dict[str, Any] = {
        "max_header_bytes": settings.max_header_bytes,
        "max_headers": settings.max_headers,
        "header_timeout_s": settings.header_timeout_s,
    }
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), limits)
