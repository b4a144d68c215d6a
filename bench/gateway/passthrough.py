"""The minimal pass-through proxy: the Python floor a gateway is measured against.

FastAPI on uvicorn (uvloop, httptools) forwarding ``/v1/*`` to one upstream with an ``aiohttp``
``ClientSession``, bytes through: no parsing of the body, no auth, no limits, no metrics. Streaming responses
are relayed chunk by chunk as they arrive. This is what DESIGN §6 measured; whatever the gearshift gateway
costs beyond it is the price of its features.

Run it with ``python -m bench.gateway.passthrough --port N --upstream http://127.0.0.1:M``.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host"})


def create_app(upstream: str) -> FastAPI:
    """A FastAPI app that forwards every ``/v1/{path}`` request to ``upstream`` (base URL, no trailing slash)."""
    state: dict[str, aiohttp.ClientSession] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, keepalive_timeout=60)
        async with aiohttp.ClientSession(base_url=upstream, connector=connector, auto_decompress=False) as session:
            state["session"] = session
            yield

    app = FastAPI(lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)

    @app.api_route("/v1/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        upstream_response = await state["session"].request(request.method, f"/v1/{path}", data=body, headers=headers)
        out_headers = {k: v for k, v in upstream_response.headers.items() if k.lower() not in _HOP_BY_HOP}
        if upstream_response.headers.get("content-type", "").startswith("text/event-stream"):
            return StreamingResponse(
                _relay(upstream_response), status_code=upstream_response.status, headers=out_headers
            )
        content = await upstream_response.read()
        upstream_response.release()
        return Response(content, status_code=upstream_response.status, headers=out_headers)

    return app


async def _relay(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.content.iter_any():
            yield chunk
    finally:
        response.release()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Minimal FastAPI + aiohttp pass-through proxy (benchmark floor).")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="upstream base URL, e.g. http://127.0.0.1:8000")
    args = parser.parse_args(argv)
    uvicorn.run(
        create_app(args.upstream.rstrip("/")),
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
