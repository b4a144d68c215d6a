"""Sweep a live worker over (batch size, k) and measure one steady decode window per point.

For each point the profiler applies k through the control API, starts B streaming completions at once
(``ignore_eos``, long enough that none finishes inside the window), waits until every stream has its first
token (so every prompt is prefilled), scrapes ``/metrics`` (S1), waits for ``window_steps`` engine steps,
scrapes again (S2) and abandons the streams. Between S1 and S2 every step decodes exactly B sequences at k, so

- step time (seconds, worker clock) = Δ inter-token-latency sum / Δ count (one observation per sequence per step);
- batch actually decoded = Δ ITL count / Δ steps (checked against B: a point that lost a stream is rejected);
- mean context per sequence (tokens) = prompt + generated tokens halfway through the window;
- per-position acceptance = Δ accepted-per-position / Δ drafts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bench.profiler.snapshot import Snapshot
from bench.profiler.worker_client import ProfilerError, WorkerClient

PROMPT_WORD = "profile"


@dataclass(frozen=True, slots=True)
class SweepConfig:
    batch_sizes: tuple[int, ...]
    ks: tuple[int, ...]
    window_steps: int = 40
    """Engine steps measured per point."""
    prompt_words: int = 16
    temperature: float = 0.0
    max_tokens: int | None = None
    """Tokens per stream; None = 4 · window_steps · (k + 1) + 64, so no stream ends inside the window."""
    point_timeout_s: float = 60.0
    """Wall-clock limit of one point (start-up, window and drain together), seconds."""
    poll_s: float = 0.01
    """Wall-clock interval between scrapes while waiting for the window, seconds."""
    lease_s: float = 300.0
    """Lease of each applied k, worker seconds; the start-up schedule is restored at the end."""
    batch_tolerance: float = 0.25
    """Largest accepted |measured batch − B| (sequences) before a point is rejected."""
    warmup: bool = True
    """Measure the grid's first point once and discard it (a fresh engine's first steps run slow)."""


@dataclass(frozen=True, slots=True)
class Point:
    """One measured (B, k) point."""

    batch_size: int
    k: int
    step_s: float
    """Mean engine step time over the window, seconds (worker clock)."""
    steps: float
    measured_batch: float
    context_tokens: float
    """Mean context per decoding sequence over the window, tokens."""
    window: Snapshot
    """Counter changes over the window."""


Progress = Callable[[Point], None]


async def sweep(worker: WorkerClient, config: SweepConfig, *, progress: Progress | None = None) -> list[Point]:
    """Measure every (B, k) of the grid, then put the worker back on its start-up schedule."""
    model = await worker.model()
    start = await worker.speculation()
    bad = [k for k in config.ks if k > start.k_max]
    if bad:
        raise ProfilerError(f"ks: {bad} exceed the worker's k_max {start.k_max}")
    points: list[Point] = []
    try:
        for k in config.ks:
            state = await worker.set_k(k, lease_s=config.lease_s)
            if any(row[2] != k for row in state.schedule):
                raise ProfilerError(f"PUT k={k}: GET shows schedule {state.schedule}")
            if config.warmup and not points:
                await asyncio.wait_for(
                    measure_point(worker, model, config.batch_sizes[0], k, config), config.point_timeout_s
                )
            for b in config.batch_sizes:
                point = await asyncio.wait_for(measure_point(worker, model, b, k, config), config.point_timeout_s)
                points.append(point)
                if progress is not None:
                    progress(point)
    finally:
        version = (await worker.speculation()).version + 1
        await worker.set_fallback(start.fallback_schedule, version=version)
    return points


async def measure_point(worker: WorkerClient, model: str, batch: int, k: int, config: SweepConfig) -> Point:
    """Run B streams at k and measure one steady window (see the module docstring)."""
    max_tokens = config.max_tokens or 4 * config.window_steps * (k + 1) + 64
    base = await worker.snapshot()
    firsts = [asyncio.Event() for _ in range(batch)]
    tasks = [
        asyncio.create_task(
            worker.stream(
                model=model,
                prompt=" ".join([PROMPT_WORD, str(i)] * (config.prompt_words // 2)),
                max_tokens=max_tokens,
                temperature=config.temperature,
                first=first,
            )
        )
        for i, first in enumerate(firsts)
    ]
    try:
        await _until_all(firsts, tasks)
        s1 = await worker.snapshot()
        s2 = await _poll(worker.snapshot, lambda s: s.steps - s1.steps >= config.window_steps, config.poll_s)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    await _poll(worker.snapshot, lambda s: s.running == 0 and s.waiting == 0, config.poll_s)
    return _point(batch, k, base, s1, s2, config)


def _point(batch: int, k: int, base: Snapshot, s1: Snapshot, s2: Snapshot, config: SweepConfig) -> Point:
    window = s2 - s1
    if window.steps <= 0 or window.itl_count <= 0:
        raise ProfilerError(f"B={batch} k={k}: no engine steps observed in the window")
    measured = window.itl_count / window.steps
    if abs(measured - batch) > config.batch_tolerance:
        raise ProfilerError(
            f"B={batch} k={k}: the window decoded {measured:.2f} sequences per step, not {batch} "
            "(a stream ended or was preempted; raise max_tokens or lower the batch size)"
        )
    prompt = (s2 - base).prompt_tokens / batch
    generated = ((s1 - base).generation_tokens + (s2 - base).generation_tokens) / (2 * batch)
    return Point(
        batch_size=batch,
        k=k,
        step_s=window.itl_sum_s / window.itl_count,
        steps=window.steps,
        measured_batch=measured,
        context_tokens=prompt + generated,
        window=window,
    )


async def _until_all(events: list[asyncio.Event], tasks: list[asyncio.Task[None]]) -> None:
    """Wait for every event; a stream that fails first raises its error."""
    waits = [asyncio.create_task(e.wait()) for e in events]
    try:
        pending: set[asyncio.Task[Any]] = {*waits, *tasks}
        while not all(e.is_set() for e in events):
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task in tasks and task.exception() is not None:
                    raise ProfilerError(f"a stream failed: {task.exception()}")
                if task in tasks and not all(e.is_set() for e in events):
                    started = sum(e.is_set() for e in events)
                    raise ProfilerError(
                        f"a stream ended when {started} of {len(events)} streams had their first token "
                        "(the worker runs fewer at once than asked: check its max_num_seqs, or raise --max-tokens)"
                    )
    finally:
        for w in waits:
            w.cancel()


async def _poll(read: Callable[[], Awaitable[Snapshot]], done: Callable[[Snapshot], bool], every_s: float) -> Snapshot:
    """Scrape until ``done``; the caller bounds the time (``asyncio.wait_for``)."""
    while True:
        snap = await read()
        if done(snap):
            return snap
        await asyncio.sleep(every_s)
