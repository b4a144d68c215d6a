"""Load generation with ``wrk`` (Debian's wrk 4): a Lua script posts a chat-completion body (streaming or
not) and prints the summary as one JSON line, which this module parses.

wrk reports the latency of the whole response; for a 32-chunk SSE stream that is the time to the last chunk.
Time to first chunk is measured separately (``bench.gateway.ttfc``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.procs import ProcessFailed, pinned

LUA_SCRIPT = r"""
-- gearshift bench: POST an OpenAI chat body; the body and key come from the environment.
wrk.method = "POST"
wrk.body = os.getenv("GEARSHIFT_BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"
local key = os.getenv("GEARSHIFT_BENCH_KEY")
if key ~= nil and key ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. key
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "GEARSHIFT_BENCH_JSON {\"requests\": %d, \"duration_us\": %d, \"bytes\": %d, " ..
    "\"errors_connect\": %d, \"errors_read\": %d, \"errors_write\": %d, \"errors_status\": %d, " ..
    "\"errors_timeout\": %d, \"p50_us\": %d, \"p90_us\": %d, \"p99_us\": %d, \"mean_us\": %.1f, \"max_us\": %d}\n",
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.max))
end
"""

_MARK = "GEARSHIFT_BENCH_JSON "


@dataclass(frozen=True, slots=True)
class WrkResult:
    """One wrk run. Latencies are microseconds of the whole response."""

    requests: int
    duration_s: float
    errors: int
    """Connect, read, write, timeout errors and non-2xx/3xx responses."""
    p50_us: float
    p90_us: float
    p99_us: float
    mean_us: float

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0


def chat_body(*, stream: bool, model: str = "kimi-k3") -> str:
    """A small chat-completion request body (the upstream's reply does not depend on it)."""
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": "Say ok thirty-two times."}],
        "max_tokens": 32,
        "stream": stream,
    }
    return json.dumps(body, separators=(",", ":"))


def parse_output(text: str) -> WrkResult:
    """Parse the JSON summary line the Lua ``done`` hook prints."""
    for line in text.splitlines():
        if line.startswith(_MARK):
            raw = json.loads(line[len(_MARK) :])
            errors = sum(int(raw[k]) for k in raw if k.startswith("errors_"))
            return WrkResult(
                requests=int(raw["requests"]),
                duration_s=raw["duration_us"] / 1e6,
                errors=errors,
                p50_us=float(raw["p50_us"]),
                p90_us=float(raw["p90_us"]),
                p99_us=float(raw["p99_us"]),
                mean_us=float(raw["mean_us"]),
            )
    raise ProcessFailed(f"wrk: no summary line in its output:\n{text[-2000:]}")


def write_script(directory: Path) -> Path:
    path = directory / "gearshift-bench.lua"
    path.write_text(LUA_SCRIPT)
    return path


def run_wrk(
    url: str,
    *,
    script: Path,
    body: str,
    connections: int,
    duration_s: float,
    api_key: str | None = None,
    cpu: int | None = None,
) -> WrkResult:
    """Run wrk with one thread and ``connections`` connections against ``url`` for ``duration_s`` seconds."""
    binary = shutil.which("wrk")
    if binary is None:
        raise ProcessFailed("wrk: not installed (scripts/bootstrap.sh installs it: apt-get install wrk)")
    argv = [
        binary,
        "-t1",
        f"-c{connections}",
        f"-d{max(1, round(duration_s))}s",
        "--timeout",
        "10s",
        "-s",
        str(script),
        url,
    ]
    env = {**os.environ, "GEARSHIFT_BENCH_BODY": body, "GEARSHIFT_BENCH_KEY": api_key or ""}
    done = subprocess.run(
        pinned(argv, cpu), env=env, capture_output=True, text=True, timeout=duration_s + 30, check=False
    )
    if done.returncode != 0:
        raise ProcessFailed(f"wrk: exit {done.returncode}:\n{done.stderr[-2000:]}{done.stdout[-2000:]}")
    return parse_output(done.stdout)
