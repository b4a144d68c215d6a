"""Where a proxy's time goes: ``py-spy record`` on its pid during a load run, summarised from the collapsed
stacks (``--format raw``: one ``frame;frame;… count`` line per distinct stack).

Two views: the share of samples *inside* each component (a stack counts once for every component it passes
through, so the shares overlap: "42 % of samples were somewhere inside aiohttp"), and the functions that were
on top of the stack most often (self time).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench.gateway.procs import BenchProcessError

# (component, regular expression on a frame's file path) — first match wins.
COMPONENTS: tuple[tuple[str, str], ...] = (
    ("bench pass-through", r"/bench/gateway/passthrough"),
    ("gateway (gearshift)", r"(?<!/bench)/gateway/"),
    ("fleet (gearshift)", r"/fleet/"),
    ("aiohttp (upstream client)", r"/aiohttp/"),
    ("redis client", r"/redis/"),
    ("limits", r"/limits/"),
    ("starlette / fastapi", r"/(starlette|fastapi)/"),
    ("uvicorn (HTTP server)", r"/uvicorn/"),
    ("prometheus_client", r"/prometheus_client/"),
    ("opentelemetry", r"/opentelemetry/"),
    ("pydantic", r"/pydantic"),
    ("asyncio / event loop", r"(/asyncio/|uvloop)"),
)
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]+?)(?::(?P<line>\d+))?\)$")


@dataclass
class ProfileSummary:
    """Shares of py-spy samples (0 … 1) for one process."""

    target: str
    samples: int
    idle_share: float
    """Share of sampling instants at which no Python code ran (the process waited in epoll): 1 − samples /
    (duration × rate); py-spy records only active samples."""
    inclusive: dict[str, float] = field(default_factory=dict)
    """Component → share of samples whose stack passes through it (overlapping)."""
    top_self: list[tuple[str, float]] = field(default_factory=list)
    """``(function (file:line), share)`` of the frames most often on top of the stack."""


def component_of(path: str) -> str | None:
    for name, pattern in COMPONENTS:
        if re.search(pattern, path):
            return name
    return None


def _short(frame: str) -> str:
    m = _FRAME.match(frame)
    if not m:
        return frame
    file = m.group("file")
    for marker in ("site-packages/", "/work/main/", "/lib/python3.11/"):
        if marker in file:
            file = file.split(marker, 1)[1]
    return f"{m.group('func')} ({file}:{m.group('line') or '?'})"


def summarise(raw: str, *, target: str, expected_samples: int, top: int = 12) -> ProfileSummary:
    """Summarise py-spy's raw collapsed-stack output (``expected_samples`` = duration × rate)."""
    inclusive: Counter[str] = Counter()
    top_self: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [f for f in stack.split(";") if f]
        py_frames = [f for f in frames if _FRAME.match(f)]
        if not py_frames:
            continue
        seen = {c for f in py_frames if (m := _FRAME.match(f)) and (c := component_of(m.group("file")))}
        for component in seen:
            inclusive[component] += count
        top_self[_short(py_frames[-1])] += count
    if total == 0:
        return ProfileSummary(target=target, samples=0, idle_share=0.0)
    return ProfileSummary(
        target=target,
        samples=total,
        idle_share=max(0.0, 1.0 - total / expected_samples) if expected_samples > 0 else 0.0,
        inclusive={k: v / total for k, v in inclusive.most_common()},
        top_self=[(k, v / total) for k, v in top_self.most_common(top)],
    )


def record(pid: int, *, duration_s: float, out: Path, rate_hz: int = 200) -> subprocess.Popen[bytes]:
    """Start ``py-spy record`` on ``pid`` for ``duration_s`` seconds writing raw stacks to ``out``."""
    binary = shutil.which("py-spy")
    if binary is None:
        raise BenchProcessError("py-spy: not installed (it is a pinned dev dependency: pip install py-spy)")
    argv = [
        binary,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(max(1, round(duration_s))),
        "--rate",
        str(rate_hz),
        "--format",
        "raw",
        "--output",
        str(out),
    ]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
