"""A very fast fake OpenAI upstream for the gateway-cost benchmark.

A raw ``asyncio.Protocol`` HTTP/1.1 server (``httptools`` parser, ``uvloop`` when available, keep-alive) so
that the upstream costs far less CPU per request than any proxy in front of it. It answers:

- ``POST /v1/chat/completions`` and ``POST /v1/completions``: a fixed OpenAI JSON body with a ``usage``
  block, or — when the body asks for ``"stream": true`` — a 32-chunk SSE stream (chunked transfer encoding,
  one HTTP chunk per event), a final usage chunk and ``data: [DONE]``;
- ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (a few vLLM gauges, for gateways that scrape).

Responses are precomputed bytes; a request costs one parse and one ``transport.write``.
Run it with ``python -m bench.gateway.upstream --port N`` (prints ``READY <port>`` when listening).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from typing import cast

import httptools
import orjson
import uvloop

STREAM_CHUNKS = 32
MODEL = "kimi-k3"


def _completion_body() -> bytes:
    return orjson.dumps(
        {
            "id": "cmpl-bench",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": MODEL,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "ok " * 16}, "finish_reason": "length"}
            ],
            "usage": {"prompt_tokens": 16, "completion_tokens": STREAM_CHUNKS, "total_tokens": 16 + STREAM_CHUNKS},
        }
    )


def _sse_event(payload: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _http_chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _stream_body() -> bytes:
    base = {"id": "cmpl-bench", "object": "chat.completion.chunk", "created": 1_700_000_000, "model": MODEL}
    events = [
        _sse_event({**base, "choices": [{"index": 0, "delta": {"content": "ok "}, "finish_reason": None}]})
        for _ in range(STREAM_CHUNKS)
    ]
    usage = {"prompt_tokens": 16, "completion_tokens": STREAM_CHUNKS, "total_tokens": 16 + STREAM_CHUNKS}
    events.append(_sse_event({**base, "choices": [], "usage": usage}))
    events.append(b"data: [DONE]\n\n")
    return b"".join(_http_chunk(e) for e in events) + b"0\r\n\r\n"


def _response(status: str, content_type: bytes, body: bytes) -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-type: ".encode() + content_type
    return head + f"\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body


JSON_RESPONSE = _response("200 OK", b"application/json", _completion_body())
STREAM_RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n" + _stream_body()
)
MODELS_RESPONSE = _response(
    "200 OK", b"application/json", orjson.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
)
HEALTH_RESPONSE = _response("200 OK", b"text/plain", b"")
METRICS_RESPONSE = _response(
    "200 OK",
    b"text/plain; version=0.0.4",
    (
        f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 0.0\n'
        f'vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 0.0\n'
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.0\n'
    ).encode(),
)
NOT_FOUND_RESPONSE = _response("404 Not Found", b"application/json", b'{"error":{"message":"not found"}}')


class _UpstreamProtocol(asyncio.Protocol):
    """One keep-alive connection: parse requests, answer each with a precomputed response."""

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self._transport is not None:
                self._transport.close()

    def on_url(self, url: bytes) -> None:
        self._url = url
        self._body = []

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._transport is None:
            return
        self._transport.write(self._answer(self._parser.get_method(), self._url.split(b"?", 1)[0]))
        if not self._parser.should_keep_alive():
            self._transport.close()

    def _answer(self, method: bytes, path: bytes) -> bytes:
        if method == b"POST" and path in (b"/v1/chat/completions", b"/v1/completions"):
            body = b"".join(self._body)
            streaming = b'"stream":true' in body.replace(b" ", b"")
            return STREAM_RESPONSE if streaming else JSON_RESPONSE
        if method == b"GET":
            return {
                b"/v1/models": MODELS_RESPONSE,
                b"/health": HEALTH_RESPONSE,
                b"/metrics": METRICS_RESPONSE,
            }.get(path, NOT_FOUND_RESPONSE)
        return NOT_FOUND_RESPONSE


async def serve(sock: socket.socket) -> asyncio.Server:
    """Start serving on an already bound listening socket."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(_UpstreamProtocol, sock=sock, backlog=1024)


async def _main(port: int) -> None:
    sock = socket.create_server(("127.0.0.1", port), backlog=1024)
    server = await serve(sock)
    print(f"READY {sock.getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fast fake OpenAI upstream for the gateway benchmark.")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any free port)")
    args = parser.parse_args(argv)
    try:
        uvloop.run(_main(args.port))
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(0)


if __name__ == "__main__":
    main()
