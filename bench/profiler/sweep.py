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

from bench.profiler.worker_client import ProfilerError, WorkerClient
from fleet.scrape import WorkerScrape

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
    poll_s: float = 0.1
    """Wall-clock interval between scrapes while waiting for the window, seconds. Scraping a real vLLM server
    costs its API process CPU time, so keep it well above the step time on small machines."""
    lease_s: float = 300.0
    """Lease of each applied k, worker seconds; the start-up schedule is restored at the end."""
    batch_tolerance: float = 0.25
    """Largest accepted |measured batch − B| (sequences) before a point is rejected."""
    quiet_s: float = 0.5
    """Wall-clock seconds without an engine step after which the worker counts as drained."""
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
    window: WorkerScrape
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
                await _timed(measure_point(worker, model, config.batch_sizes[0], k, config), config, "warm-up")
            for b in config.batch_sizes:
                point = await _timed(measure_point(worker, model, b, k, config), config, f"B={b} k={k}")
                points.append(point)
                if progress is not None:
                    progress(point)
    finally:
        version = (await worker.speculation()).version + 1
        await worker.set_fallback(start.fallback_schedule, version=version)
    return points


async def _timed(point: Awaitable[Point], config: SweepConfig, what: str) -> Point:
    try:
        return await asyncio.wait_for(point, config.point_timeout_s)
    except TimeoutError as exc:
        raise ProfilerError(f"{what}: no steady window within {config.point_timeout_s:g} s") from exc


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
        s2 = await _poll(worker.snapshot, lambda s: s.steps - s1.steps >= config.window_steps, tasks, config.poll_s)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    await _drain(worker, config)
    return _point(batch, k, base, s1, s2, config)


async def _drain(worker: WorkerClient, config: SweepConfig) -> None:
    """Until the abandoned streams have left the engine: its gauges read idle, or its step counter stood still
    for ``quiet_s`` (vLLM refreshes the gauges only on engine steps, so after the last abort they can stay stale)."""
    last = await worker.snapshot()
    still_since = asyncio.get_running_loop().time()
    while not (last.running == 0 and last.waiting == 0):
        await asyncio.sleep(config.poll_s)
        snap = await worker.snapshot()
        now = asyncio.get_running_loop().time()
        if snap.steps != last.steps:
            still_since = now
        elif now - still_since >= config.quiet_s:
            return
        last = snap


def _point(batch: int, k: int, base: WorkerScrape, s1: WorkerScrape, s2: WorkerScrape, config: SweepConfig) -> Point:
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


async def _poll(
    read: Callable[[], Awaitable[WorkerScrape]],
    done: Callable[[WorkerScrape], bool],
    streams: list[asyncio.Task[None]],
    every_s: float,
) -> WorkerScrape:
    """Scrape until ``done``; fails if every stream ended first. The caller bounds the time (``wait_for``)."""
    while True:
        ended = all(t.done() for t in streams)
        snap = await read()
        if done(snap):
            return snap
        if ended:
            raise ProfilerError(
                "every stream ended before the window closed: raise --max-tokens or lower --window-steps"
            )
        await asyncio.sleep(every_s)
