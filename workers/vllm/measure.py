"""Measure a real vLLM CPU worker under the plugin: start-up time, memory, and the effect of each k.

A command, not a test (``gearshift worker measure``): it starts the tiny random Llama with ngram speculation,
then for each k sets the schedule through ``PUT /gearshift/v1/speculation`` and runs one bounded batch of
greedy ``ignore_eos`` completions, reading vLLM's own counters before and after.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from fleet.scrape import WorkerScrape, parse_worker_metrics
from fleet.speculation import SpeculationUpdate
from fleet.speculation_client import SpeculationClient


@dataclass(frozen=True)
class BatchResult:
    completion_tokens: int
    seconds: float
    counters: WorkerScrape
    """Change of vLLM's counters over the batch."""

    @property
    def tokens_per_second(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds > 0 else 0.0


async def read_counters(client: httpx.AsyncClient, base_url: str) -> WorkerScrape:
    response = await client.get(f"{base_url}/metrics")
    response.raise_for_status()
    return parse_worker_metrics(response.text)


async def _complete(
    client: httpx.AsyncClient, base_url: str, *, model: str, prompt: str, max_tokens: int, temperature: float
) -> int:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature}
    response = await client.post(f"{base_url}/v1/completions", json={**body, "ignore_eos": True})
    response.raise_for_status()
    return int(response.json()["usage"]["completion_tokens"])


async def run_batch(
    client: httpx.AsyncClient,
    base_url: str,
    *,
    model: str,
    requests: int,
    max_tokens: int,
    temperature: float = 0.0,
) -> BatchResult:
    """``requests`` concurrent completions of ``max_tokens`` tokens each; counters are read around the batch."""
    before = await read_counters(client, base_url)
    started = time.perf_counter()
    prompts = [f"the quick brown fox {i} jumps" for i in range(requests)]
    tokens = await asyncio.gather(
        *(
            _complete(client, base_url, model=model, prompt=p, max_tokens=max_tokens, temperature=temperature)
            for p in prompts
        )
    )
    seconds = time.perf_counter() - started
    after = await read_counters(client, base_url)
    return BatchResult(completion_tokens=sum(tokens), seconds=seconds, counters=after - before)


def process_group_rss_bytes(pgid: int, proc_root: Path = Path("/proc")) -> int:
    """Sum of resident set sizes, bytes, of every process in group ``pgid`` (API server, EngineCore, worker).

    Shared pages count once per process, so this is an upper bound of the memory the worker holds.
    """
    total = 0
    for stat in proc_root.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # fields after "(comm)": state, ppid, pgrp, …
                continue
            status = (stat.parent / "status").read_text()
        except (OSError, IndexError, ValueError):
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
