"""Measure a real vLLM CPU worker under the plugin: start-up time, memory, and the effect of each k.

A command, not a test (``gearshift worker measure``): it starts the tiny random Llama with ngram speculation,
then for each k sets the schedule through ``PUT /gearshift/v1/speculation`` and runs one bounded batch of
greedy ``ignore_eos`` completions, reading vLLM's own counters before and after.

``gearshift worker measure --k0-tax`` instead compares the same model and load on two servers: one started with
speculation and set to k = 0, one started without a speculative config (``without_speculation``). Their batches
alternate, so noise from other work on the machine falls on both; the tax is the ratio of their per-token times.
"""

from __future__ import annotations

import asyncio
import math
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from fleet.scrape import WorkerScrape, parse_worker_metrics
from fleet.speculation import SpeculationUpdate
from fleet.speculation_client import SpeculationClient
from workers.vllm.launcher import LaunchPlan

SPECULATIVE_CONFIG_FLAG = "--speculative-config"


@dataclass(frozen=True)
class BatchResult:
    completion_tokens: int
    seconds: float
    counters: WorkerScrape
    """Change of vLLM's counters over the batch."""
    cpu_s: float | None = None
    """CPU seconds the server's processes used over the batch (None: not measured). Unlike wall time, other work
    on the machine barely moves it."""
    texts: tuple[str, ...] = ()
    """The completions' texts, in request order (prompt ``i`` is ``batch_prompt(i)``)."""

    @property
    def tokens_per_second(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds > 0 else 0.0


async def read_counters(client: httpx.AsyncClient, base_url: str) -> WorkerScrape:
    response = await client.get(f"{base_url}/metrics")
    response.raise_for_status()
    return parse_worker_metrics(response.text)


def batch_prompt(i: int) -> str:
    """The prompt of a batch's request ``i``: distinct per request, the same on every server."""
    return f"the quick brown fox {i} jumps"


async def _complete(
    client: httpx.AsyncClient, base_url: str, *, model: str, prompt: str, max_tokens: int, temperature: float
) -> tuple[int, str]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature}
    response = await client.post(f"{base_url}/v1/completions", json={**body, "ignore_eos": True})
    response.raise_for_status()
    answer = response.json()
    return int(answer["usage"]["completion_tokens"]), str(answer["choices"][0]["text"])


async def run_batch(
    client: httpx.AsyncClient,
    base_url: str,
    *,
    model: str,
    requests: int,
    max_tokens: int,
    temperature: float = 0.0,
    cpu_pgid: int | None = None,
) -> BatchResult:
    """``requests`` concurrent completions of ``max_tokens`` tokens each; counters are read around the batch, and
    the CPU time of process group ``cpu_pgid`` (the server) when given."""
    before = await read_counters(client, base_url)
    cpu_before = process_group_cpu_seconds(cpu_pgid) if cpu_pgid is not None else None
    started = time.perf_counter()
    prompts = [batch_prompt(i) for i in range(requests)]
    answers = await asyncio.gather(
        *(
            _complete(client, base_url, model=model, prompt=p, max_tokens=max_tokens, temperature=temperature)
            for p in prompts
        )
    )
    seconds = time.perf_counter() - started
    cpu_s = (
        process_group_cpu_seconds(cpu_pgid) - cpu_before if cpu_pgid is not None and cpu_before is not None else None
    )
    after = await read_counters(client, base_url)
    return BatchResult(
        completion_tokens=sum(n for n, _ in answers),
        seconds=seconds,
        counters=after - before,
        cpu_s=cpu_s,
        texts=tuple(text for _, text in answers),
    )


def _group_stats(pgid: int, proc_root: Path) -> Iterator[tuple[Path, list[str]]]:
    """``(/proc/<pid>, stat fields after "(comm)")`` of every process in group ``pgid``."""
    for stat in proc_root.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # fields after "(comm)": state, ppid, pgrp, …
                yield stat.parent, fields
        except (OSError, IndexError, ValueError):
            continue  # the process ended while we looked


def _run_time_ns(proc: Path) -> int | None:
    """Nanoseconds the process's live threads have run (``/proc/<pid>/task/*/schedstat``, first field: the
    scheduler's run time); None without schedstat. A thread that ends takes its time with it: a difference of two
    reads is exact only if no thread ended in between (a vLLM server keeps its threads: 64 before and after each
    batch, checked on the tiny CPU worker)."""
    total, found = 0, False
    for schedstat in proc.glob("task/[0-9]*/schedstat"):
        try:
            total += int(schedstat.read_text().split()[0])
            found = True
        except (OSError, IndexError, ValueError):
            continue  # the thread ended while we looked
    return total if found else None


def process_group_cpu_seconds(pgid: int, proc_root: Path = Path("/proc")) -> float:
    """CPU seconds used so far by the live processes of group ``pgid``: their threads' run time from schedstat
    (nanoseconds) where the kernel has it, else user + system time from ``stat``, which Linux reports in whole
    clock ticks (10 ms) per process: a batch of 150 ms on a server of two processes is read to ±20 ms, ±13 %."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for proc, fields in _group_stats(pgid, proc_root):
        run_ns = _run_time_ns(proc)
        total += run_ns / 1e9 if run_ns is not None else (int(fields[11]) + int(fields[12])) / ticks
    return total


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free confidence interval of the median of ``values`` (the order statistics whose ranks the
    binomial(n, 1/2) bounds at ``confidence``); None when ``values`` are too few for it (6 for 95 %). Paired
    rounds differ by noise that is neither normal nor steady, so no distribution is assumed."""
    xs = sorted(values)
    n = len(xs)
    tail = (1 - confidence) / 2
    # the largest j with P(Binomial(n, 1/2) < j) <= tail: the interval is [x_(j), x_(n-j+1)], ranks from 1
    j, below = 0, 0.0
    while j < n:
        nxt = below + math.comb(n, j) / 2**n
        if nxt > tail:
            break
        below, j = nxt, j + 1
    if j == 0:
        return None
    return xs[j - 1], xs[n - j]


def process_group_rss_bytes(pgid: int, proc_root: Path = Path("/proc")) -> int:
    """Sum of resident set sizes, bytes, of every process in group ``pgid`` (API server, EngineCore, worker).

    Shared pages count once per process, so this is an upper bound of the memory the worker holds.
    """
    total = 0
    for proc, _ in _group_stats(pgid, proc_root):
        try:
            status = (proc / "status").read_text()
        except OSError:
            continue  # the process ended while we looked
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


@dataclass(frozen=True)
class KResult:
    """One k over all rounds: counters summed, throughput as the median of the rounds (tokens/s)."""

    k: int
    batches: tuple[BatchResult, ...]

    @property
    def counters(self) -> WorkerScrape:
        return sum((b.counters for b in self.batches), start=WorkerScrape())

    @property
    def tokens_per_second(self) -> float:
        return statistics.median(b.tokens_per_second for b in self.batches)


async def sweep(
    base_url: str,
    *,
    model: str,
    ks: Sequence[int],
    token: str,
    requests: int,
    max_tokens: int,
    rounds: int = 3,
    timeout_s: float = 120.0,
) -> list[KResult]:
    """``rounds`` times over ``ks``: set k (versions 1, 2, …), run one batch. Interleaving the k values spreads
    noise from other work on the machine over all of them; one unmeasured batch first warms the engine up."""
    batches: dict[int, list[BatchResult]] = {k: [] for k in ks}
    version = 0
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        control = SpeculationClient(client, control_token=token)
        await run_batch(client, base_url, model=model, requests=requests, max_tokens=max_tokens)
        for _ in range(rounds):
            for k in ks:
                version += 1
                update = SpeculationUpdate(k=k, version=version, lease_seconds=600.0, reason="measure")
                await control.update(base_url, update)
                batch = await run_batch(client, base_url, model=model, requests=requests, max_tokens=max_tokens)
                batches[k].append(batch)
    return [KResult(k=k, batches=tuple(batches[k])) for k in ks]


def format_table(results: Sequence[KResult]) -> str:
    lines = [f"{'k':>3} {'drafts':>7} {'draft tok/draft':>16} {'tokens/draft':>13} {'tokens/s':>9}"]
    for r in results:
        c = r.counters
        per_draft = "-" if c.draft_tokens_per_draft is None else f"{c.draft_tokens_per_draft:.2f}"
        emitted = "-" if c.tokens_per_draft is None else f"{c.tokens_per_draft:.2f}"
        lines.append(f"{r.k:>3} {c.drafts:>7.0f} {per_draft:>16} {emitted:>13} {r.tokens_per_second:>9.1f}")
    return "\n".join(lines)


def without_speculation(plan: LaunchPlan) -> LaunchPlan:
    """``plan`` with its ``--speculative-config`` (flag and value) removed: the same server started without
    speculation, which loads no drafter and captures nothing for it."""
    argv = list(plan.argv)
    if SPECULATIVE_CONFIG_FLAG in argv:
        i = argv.index(SPECULATIVE_CONFIG_FLAG)
        del argv[i : i + 2]
    return LaunchPlan(argv=tuple(argv), env=plan.env)


def seconds_per_token(batch: BatchResult, requests: int) -> float:
    """Mean time between one stream's tokens over a batch of ``requests`` concurrent streams, seconds."""
    return batch.seconds * requests / batch.completion_tokens if batch.completion_tokens else 0.0


@dataclass(frozen=True)
class TaxResult:
    """k = 0 on a speculating server against a server started without speculation, at one batch size."""

    requests: int
    with_drafter: tuple[BatchResult, ...]
    without: tuple[BatchResult, ...]

    def _median(self, batches: tuple[BatchResult, ...]) -> float:
        return statistics.median(seconds_per_token(b, self.requests) for b in batches)

    @property
    def tpot_with_drafter_s(self) -> float:
        return self._median(self.with_drafter)

    @property
    def tpot_without_s(self) -> float:
        return self._median(self.without)

    @property
    def round_taxes(self) -> tuple[float, ...]:
        """Per round, the speculating server's time per token over the other's, less 1: the two batches of a
        round ran back to back, so load that drifts over the run cancels within each pair."""
        pairs = zip(self.with_drafter, self.without, strict=True)
        return tuple(
            seconds_per_token(a, self.requests) / seconds_per_token(b, self.requests) - 1
            for a, b in pairs
            if seconds_per_token(b, self.requests) > 0
        )

    @property
    def tax(self) -> float:
        """Extra time per token at k = 0 with the drafter loaded, a fraction (0.1 = +10 %): the median round."""
        return statistics.median(self.round_taxes) if self.round_taxes else 0.0

    @property
    def tax_interval(self) -> tuple[float, float] | None:
        """95 % confidence interval of ``tax`` (``median_interval`` of the rounds); None for fewer than 6 rounds."""
        return median_interval(self.round_taxes)

    @property
    def cpu_round_taxes(self) -> tuple[float, ...] | None:
        """Per round, the speculating server's CPU seconds per token over the other's, less 1 (None when CPU time
        was not measured)."""
        pairs = list(zip(self.with_drafter, self.without, strict=True))
        if any(a.cpu_s is None or b.cpu_s is None for a, b in pairs):
            return None
        return tuple(
            (a.cpu_s / a.completion_tokens) / (b.cpu_s / b.completion_tokens) - 1  # type: ignore[operator]
            for a, b in pairs
            if a.completion_tokens and b.completion_tokens and b.cpu_s
        )

    @property
    def cpu_tax(self) -> float | None:
        """Extra CPU time per token at k = 0 with the drafter loaded, a fraction: the median round of
        ``cpu_round_taxes`` (None when CPU time was not measured)."""
        rounds = self.cpu_round_taxes
        return statistics.median(rounds) if rounds else None

    @property
    def cpu_tax_interval(self) -> tuple[float, float] | None:
        """95 % confidence interval of ``cpu_tax``; None without CPU time or with fewer than 6 rounds."""
        rounds = self.cpu_round_taxes
        return None if rounds is None else median_interval(rounds)

    @property
    def drafts(self) -> float:
        """Drafts the speculating server made at k = 0 (must be 0: k = 0 stops drafting)."""
        return sum(b.counters.drafts for b in self.with_drafter)


async def k0_tax(
    spec_url: str,
    plain_url: str,
    *,
    model: str,
    token: str,
    batch_sizes: Sequence[int],
    max_tokens: int,
    rounds: int = 3,
    timeout_s: float = 120.0,
    pgids: tuple[int, int] | None = None,
) -> list[TaxResult]:
    """Set k = 0 on ``spec_url`` (a server started with speculation), warm both servers up, then ``rounds`` times
    per batch size run one batch on each, alternating which goes first. ``pgids``: the two servers' process
    groups, whose CPU time is then measured too."""
    runs: dict[int, tuple[list[BatchResult], list[BatchResult]]] = {n: ([], []) for n in batch_sizes}
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        update = SpeculationUpdate(k=0, version=1, lease_seconds=3600.0, reason="measure k=0 tax")
        await SpeculationClient(client, control_token=token).update(spec_url, update)
        for url in (spec_url, plain_url):
            await run_batch(client, url, model=model, requests=max(batch_sizes), max_tokens=max_tokens)
        for r in range(rounds):
            for n in batch_sizes:
                order = ((spec_url, 0), (plain_url, 1)) if r % 2 == 0 else ((plain_url, 1), (spec_url, 0))
                for url, side in order:
                    pgid = pgids[side] if pgids is not None else None
                    batch = await run_batch(client, url, model=model, requests=n, max_tokens=max_tokens, cpu_pgid=pgid)
                    runs[n][side].append(batch)
    return [TaxResult(n, tuple(runs[n][0]), tuple(runs[n][1])) for n in batch_sizes]


def format_tax_table(results: Sequence[TaxResult]) -> str:
    head = f"{'batch':>5} {'k=0 drafter ms/tok':>19} {'no spec ms/tok':>15} {'k=0 tax':>8} {'rounds min…max':>16}"
    lines = [head + f" {'CPU-time tax':>13} {'drafts':>7}"]
    for r in results:
        spread = f"{min(r.round_taxes, default=0.0):+.1%}…{max(r.round_taxes, default=0.0):+.1%}"
        cpu = "-" if r.cpu_tax is None else f"{r.cpu_tax:+.1%}"
        lines.append(
            f"{r.requests:>5} {r.tpot_with_drafter_s * 1e3:>19.3f} {r.tpot_without_s * 1e3:>15.3f} "
            f"{r.tax:>+8.1%} {spread:>16} {cpu:>13} {r.drafts:>7.0f}"
        )
    return "\n".join(lines)
