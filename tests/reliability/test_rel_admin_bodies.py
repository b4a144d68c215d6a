"""Defect 2 (issue 23) and the admin security pass, on a real gateway on loopback with raw HTTP/1.1 (a client that
declares a huge body and sends none, or streams one without a length):

- an admin route authenticates before it reads its body: a wrong or missing key is answered 401 at once, whatever
  body it declares (before the fix FastAPI read and parsed the whole body, then ran the admin check);
- every route caps its body before parsing: 413 for a declared or a streamed body over the cap (before the fix
  only the completion routes had a cap: an admin could be sent gigabytes);
- failed admin authentication is rate limited per client address: 429 with Retry-After, and nothing checked."""

from __future__ import annotations

import asyncio
import re

import pytest

from .rel_harness import ADMIN_KEY, KEYS, fleet_of, live_gateway

ANSWER_S = 5.0
"""How long a client waits for the status line; a gateway still reading the declared body never answers."""
HUGE = 10 * 1024**3
"""A declared Content-Length no route may read (10 GiB)."""


async def _status(url: str, head: str, body_chunks: tuple[bytes, ...] = ()) -> tuple[int, dict[str, str]]:
    """Send ``head`` (request line and headers, CRLF-terminated) then ``body_chunks``; the response's status and
    headers, or status 0 when none came within ``ANSWER_S``."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head.encode() + b"\r\n")
        for chunk in body_chunks:
            writer.write(chunk)
        await writer.drain()
        try:
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), ANSWER_S)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            return 0, {}
    finally:
        writer.close()
    lines = raw.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}


def _head(route: str, *, key: str | None, length: int | None = None, chunked: bool = False) -> str:
    lines = [f"{route} HTTP/1.1", "Host: gateway", "Content-Type: application/json"]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return "\r\n".join(lines) + "\r\n"


ADMIN_ROUTES = (
    "POST /admin/v1/tenants",
    "PATCH /admin/v1/tenants/alpha",
    "POST /admin/v1/keys",
    "PUT /admin/v1/brownout",
    "PATCH /admin/v1/tiers/standard",
)


@pytest.mark.parametrize("route", ADMIN_ROUTES)
async def test_an_admin_route_refuses_a_wrong_key_before_reading_the_body(route: str) -> None:
    async with live_gateway(fleet_of(["http://127.0.0.1:9"])) as live:
        for key in ("wrong-admin-key", None):
            status, _ = await _status(live.url, _head(route, key=key, length=HUGE))
            assert status == 401, f"{route} with key {key!r}: {status or 'no answer'}"


@pytest.mark.parametrize("route", ADMIN_ROUTES)
async def test_an_admin_body_over_the_cap_is_refused_before_parsing(route: str) -> None:
    async with live_gateway(fleet_of(["http://127.0.0.1:9"])) as live:
        declared, _ = await _status(live.url, _head(route, key=ADMIN_KEY, length=HUGE))
        assert declared == 413
        cap = 1024 * 1024  # GEARSHIFT_MAX_ADMIN_BODY_BYTES' default
        chunk = b"[" + b" " * (cap + 1024)  # streamed without a length: counted as it arrives
        streamed, _ = await _status(
            live.url, _head(route, key=ADMIN_KEY, chunked=True), (f"{len(chunk):x}\r\n".encode(), chunk, b"\r\n")
        )
        assert streamed == 413


async def test_failed_admin_authentication_is_rate_limited_per_client() -> None:
    async with live_gateway(fleet_of(["http://127.0.0.1:9"])) as live:
        allowed = 10  # GEARSHIFT_ADMIN_AUTH_FAILURES_PER_MINUTE's default
        keys = "POST /admin/v1/keys"
        statuses = [
            (await _status(live.url, _head(keys, key=f"guess-{i}", length=2), (b"{}",)))[0] for i in range(allowed + 1)
        ]
        assert statuses[:allowed] == [401] * allowed
        assert statuses[allowed] == 429
        status, headers = await _status(live.url, _head(keys, key=ADMIN_KEY, length=2), (b"{}",))
        assert status == 429, "while blocked nothing is checked: a guess cannot be told from the right key"
        assert float(headers["retry-after"]) > 0


CONSOLE_ACTIONS = ("POST /console/tenants", "POST /console/tenants/alpha", "POST /console/tiers/batch")
UNSENT = 8 * 1024 * 1024
"""A declared body under the general cap (``GEARSHIFT_MAX_BODY_BYTES``, 16 MiB) that the client never sends."""


async def _console_cookie(url: str) -> str:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        form = f"admin_key={ADMIN_KEY}".encode()
        head = "POST /console/login HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        writer.write(f"{head}Content-Length: {len(form)}\r\n\r\n".encode() + form)
        await writer.drain()
        raw = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), ANSWER_S)).decode("latin-1")
    finally:
        writer.close()
    cookie = next(line for line in raw.split("\r\n") if line.lower().startswith("set-cookie:"))
    return cookie.split(":", 1)[1].split(";", 1)[0].strip()


@pytest.mark.parametrize("route", CONSOLE_ACTIONS)
async def test_a_console_action_needs_its_session_before_the_body_is_read_and_is_capped_like_the_admin_api(
    route: str,
) -> None:
    """The console changes tenants as the admin API does, so it is guarded as the admin API is: without a session
    a form is answered (to the login page) without its body being read, and a session's form is capped at
    ``GEARSHIFT_MAX_ADMIN_BODY_BYTES`` (before, the body was read first, up to the general 16 MiB cap)."""
    async with live_gateway(fleet_of(["http://127.0.0.1:9"])) as live:
        status, headers = await _status(live.url, _head(route, key=None, length=UNSENT))
        assert status == 303, f"{route} without a session: {status or 'no answer'}"
        assert headers["location"].endswith("/console/login")
        cookie = await _console_cookie(live.url)
        head = _head(route, key=None, length=UNSENT) + f"Cookie: {cookie}\r\n"
        status, _ = await _status(live.url, head)
        assert status == 413, f"{route} with a session, {UNSENT} bytes declared: {status or 'no answer'}"


async def test_every_route_that_takes_a_body_refuses_one_over_its_cap_before_reading_it() -> None:
    """Every method and path of the OpenAPI document that may carry a body (so a route added later is covered), and
    the console's forms (left out of the document), with the admin key and a console session: a declared body over
    its cap is answered 413 at once."""
    async with live_gateway(fleet_of(["http://127.0.0.1:9"])) as live:
        cookie = await _console_cookie(live.url)
        status, _ = await _status(live.url, "GET /openapi.json HTTP/1.1\r\nHost: gateway\r\n")
        assert status == 200
        doc = live.server.app.openapi()
        routes = [
            (method.upper(), re.sub(r"\{[^}]+\}", "alpha", path))
            for path, ops in doc["paths"].items()
            for method in ops
            if method in ("post", "put", "patch", "delete")
        ]
        assert len(routes) >= 10, routes
        console = [("POST", "/console/login"), ("POST", "/console/logout"), ("POST", "/console/tenants/alpha/keys")]
        for method, path in [*routes, *console, *(tuple(r.split()) for r in CONSOLE_ACTIONS)]:
            key = KEYS["alpha"] if path.startswith("/v1/") else ADMIN_KEY
            head = _head(f"{method} {path}", key=key, length=HUGE) + f"Cookie: {cookie}\r\n"
            status, _ = await _status(live.url, head)
            assert status == 413, f"{method} {path}: {status or 'no answer'}"
