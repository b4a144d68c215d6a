"""Where a proxy's time goes: ``py-spy record`` on its pid during a load run, summarised from the collapsed
stacks (``--format raw``: one ``frame;frame;… count`` line per distinct stack).

Two views: the share of samples *inside* each component (a stack counts once for every component it passes
through, so the shares overlap: "42 % of samples were somewhere inside aiohttp"), and the functions that were
on top of the stack most often (self time). Frames up to the event loop's entry (``asyncio.Runner.run``) are
left out, so the shares describe the work the loop's callbacks do; a sample whose top frame is the loop entry
itself is time in uvloop's C code (sockets, httptools parsing). Threads parked in a lock or queue are idle.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench.procs import ProcessFailed

# (component, regular expression on a frame's file path) — first match wins.
COMPONENTS: tuple[tuple[str, str], ...] = (
    ("bench pass-through / launcher", r"(^|/)bench/"),
    ("gateway (gearshift)", r"(^|/)gateway/"),
    ("store (fleet/store/)", r"(^|/)fleet/store"),
    ("fleet (gearshift, other)", r"(^|/)fleet/"),
    ("aiohttp (upstream client)", r"(^|/)aiohttp/"),
    ("redis client", r"(^|/)redis/"),
    ("limits", r"(^|/)limits/"),
    ("starlette / fastapi", r"(^|/)(starlette|fastapi)/"),
    ("uvicorn (HTTP server)", r"(^|/)uvicorn/"),
    ("prometheus_client", r"(^|/)prometheus_client/"),
    ("opentelemetry", r"(^|/)opentelemetry/"),
    ("pydantic", r"(^|/)pydantic"),
    ("orjson / json", r"(^|/)(orjson|json)/"),
    ("asyncio / event loop", r"((^|/)asyncio/|uvloop)"),
)
"""``(component, regular expression on a frame's file path)``; the first match wins. py-spy prints paths
relative to ``site-packages`` or the working directory (``uvicorn/main.py``, ``gateway/pipeline.py``)."""
_IDLE_TOP = re.compile(r"^\S*(wait|get|_wait_for_tstate_lock|select|poll)\S* \((threading|queue|selectors)\.py")
"""A thread parked in a lock, queue or selector: a sleeping pool thread, not work."""
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


LOOP_ITSELF = "event loop itself (uvloop's C code: socket I/O, HTTP parsing in httptools)"
_LOOP_ENTRY = re.compile(r"\((asyncio/runners\.py|asyncio/base_events\.py|uvloop/__init__\.py)")


def _above_event_loop(frames: list[str]) -> list[str]:
    """The frames a callback of the event loop runs (everything above the loop's entry point)."""
    last = max((i for i, f in enumerate(frames) if _LOOP_ENTRY.search(f)), default=-1)
    return frames[last + 1 :]


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
        frames = [f for f in stack.split(";") if f]
        py_frames = [f for f in frames if _FRAME.match(f)]
        if not py_frames or _IDLE_TOP.match(py_frames[-1]):
            continue
        total += count
        work = _above_event_loop(py_frames)
        if not work:
            inclusive[LOOP_ITSELF] += count
            top_self[LOOP_ITSELF] += count
            continue
        seen = {c for f in work if (m := _FRAME.match(f)) and (c := component_of(m.group("file")))}
        for component in seen:
            inclusive[component] += count
        top_self[_short(work[-1])] += count
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
        raise ProcessFailed("py-spy: not installed (the bench extra pins it: pip install -e '.[bench]')")
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
