"""Time to first chunk of a streamed completion, measured by a small aiohttp client at concurrency 1.

wrk only sees whole responses, so the first-chunk latency is measured here: sequential streaming requests,
each timed from just before the request is sent to the arrival of the first SSE ``data:`` bytes; the rest
of the stream is read and checked to end with ``[DONE]``. At concurrency 1 the client's own cost is the
same for every target, so the differences between targets are the proxies' added latency.

Run in a separate process (``python -m bench.gateway.ttfc URL ...``) so it can be pinned beside wrk.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass

import aiohttp
import uvloop

from fleet.stats import percentile


@dataclass(frozen=True, slots=True)
class FirstChunkResult:
    """Microseconds from sending the request to the first SSE bytes."""

    samples: int
    p50_us: float
    p99_us: float
    incomplete: int
    """Streams that did not end with ``data: [DONE]`` or answered non-200."""


async def measure(
    url: str, *, body: bytes, api_key: str | None, duration_s: float, max_requests: int = 20_000
) -> FirstChunkResult:
    """Sequential streaming requests for ``duration_s`` seconds (at most ``max_requests``)."""
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    samples: list[float] = []
    incomplete = 0
    deadline = time.perf_counter() + duration_s
    async with aiohttp.ClientSession() as session:
        while time.perf_counter() < deadline and len(samples) + incomplete < max_requests:
            start = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as response:
                first = await response.content.readany()
                first_at = time.perf_counter()
                rest = await response.read()
            if response.status != 200 or not (first + rest).rstrip().endswith(b"data: [DONE]"):
                incomplete += 1
                continue
            samples.append((first_at - start) * 1e6)
    return FirstChunkResult(
        samples=len(samples), p50_us=percentile(samples, 0.5), p99_us=percentile(samples, 0.99), incomplete=incomplete
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Time to first chunk of streamed completions at concurrency 1.")
    parser.add_argument("url")
    parser.add_argument("--body", required=True)
    parser.add_argument("--api-key", default="")
    parser.add_argument("--duration-s", type=float, default=2.0)
    args = parser.parse_args(argv)
    result = uvloop.run(
        measure(args.url, body=args.body.encode(), api_key=args.api_key or None, duration_s=args.duration_s)
    )
    print(json.dumps(asdict(result)))


if __name__ == "__main__":
    main()
