"""The idle-drafter tax on a real vLLM CPU worker, before and after the plugin's skip (``gearshift worker measure
--k0-tax``), the greedy outputs at k = 0, and the acceptance after k returns.

Three servers of the same tiny model, command and load: ``plain`` started without a speculative config,
``stock`` with speculation and the skip off (``GEARSHIFT_IDLE_DRAFTER=stock``: vLLM's own k = 0), ``skip`` with
it on. Both speculating servers are set to k = 0. Each round runs one batch per batch size on every server, the
order rotating each round, so load from other work on the machine falls on all three alike; a server's tax is
the median over rounds of its time per token over ``plain``'s in the same round (``TaxResult``), given with the
distribution-free 95 % confidence interval of that median (``measure.median_interval``, from 6 rounds), in wall
time and in CPU time of the server's processes (exact per-thread run time, ``measure.process_group_cpu_seconds``).

Acceptance: ``requests`` greedy streams of ``max_tokens`` tokens each; once every stream has half its tokens,
counters are read, and for the "left" run k goes from 0 to k_max at that moment; the window is from then to the
end. A run that never left k_max is read over the same window. The check runs on the skip, on stock vLLM and on
the ablation ``skip-no-catch-up`` (the skip without its catch-up, whose drafter's KV keeps a hole at every
position computed at k = 0): the skip must stay within 2 %; the ablation shows how far acceptance falls when
the drafter's context is wrong, so that passing the check means something.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import httpx

from fleet.scrape import WorkerScrape
from fleet.speculation import SpeculationUpdate
from fleet.speculation_client import SpeculationClient
from workers.vllm.measure import BatchResult, TaxResult, batch_prompt, read_counters, run_batch

PLAIN = "plain"
ARMS = (PLAIN, "stock", "skip")
"""Server names: without speculation, speculation with vLLM's own k = 0, speculation with the plugin's skip."""
NO_CATCH_UP = "skip-no-catch-up"
"""The ablation's server (the skip without its catch-up): in the acceptance check only, to show it can fail."""
ARM_ENV: Mapping[str, Mapping[str, str]] = {
    PLAIN: {},
    "stock": {"GEARSHIFT_IDLE_DRAFTER": "stock"},
    "skip": {"GEARSHIFT_IDLE_DRAFTER": "skip"},
    NO_CATCH_UP: {"GEARSHIFT_IDLE_DRAFTER": "skip-no-catch-up"},
}
"""Each server's environment over its launch plan's."""
ACCEPTANCE_ARMS = ("skip", "stock", NO_CATCH_UP)
"""The servers the acceptance check reads, in order."""
ACCEPTANCE_TOLERANCE = 0.02
"""Acceptance after the return within 2 % of a batch that never left k_max (issue 24)."""


@dataclass(frozen=True)
class IdleTaxRun:
    """Every batch of every server, by (server, batch size), in round order."""

    batches: Mapping[tuple[str, int], tuple[BatchResult, ...]]

    def tax(self, arm: str, requests: int) -> TaxResult:
        return TaxResult(requests, self.batches[(arm, requests)], self.batches[(PLAIN, requests)])

    def outputs_equal(self, arm: str, requests: int) -> bool:
        """Every completion of ``arm`` equals ``plain``'s for the same prompt (greedy, so they must)."""
        plain = self.batches[(PLAIN, requests)]
        return all(a.texts == b.texts and a.texts for a, b in zip(self.batches[(arm, requests)], plain, strict=True))


def rotated(names: Sequence[str], turn: int) -> list[str]:
    """``names`` starting at ``turn`` (mod its length): who goes first changes every round."""
    i = turn % len(names)
    return [*names[i:], *names[:i]]


async def idle_tax(
    urls: Mapping[str, str],
    *,
    model: str,
    token: str,
    batch_sizes: Sequence[int],
    max_tokens: int,
    rounds: int,
    pgids: Mapping[str, int] | None = None,
    timeout_s: float = 300.0,
) -> IdleTaxRun:
    """Set k = 0 on every server but ``plain``, warm each up with one batch, then ``rounds`` rounds."""
    names = list(urls)
    runs: dict[tuple[str, int], list[BatchResult]] = {(a, n): [] for a in names for n in batch_sizes}
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        control = SpeculationClient(client, control_token=token)
        for name in names:
            if name != PLAIN:
                await control.update(urls[name], SpeculationUpdate(k=0, version=1, lease_seconds=3600.0, reason="tax"))
            await run_batch(client, urls[name], model=model, requests=max(batch_sizes), max_tokens=max_tokens)
        for r in range(rounds):
            for n in batch_sizes:
                for name in rotated(names, r):
                    pgid = None if pgids is None else pgids.get(name)
                    batch = await run_batch(
                        client, urls[name], model=model, requests=n, max_tokens=max_tokens, cpu_pgid=pgid
                    )
                    runs[(name, n)].append(batch)
    return IdleTaxRun({key: tuple(batches) for key, batches in runs.items()})


@dataclass(frozen=True)
class AcceptanceWindow:
    """Counters over the second half of a batch of streams, and that window's length, seconds."""

    counters: WorkerScrape
    seconds: float

    @property
    def rate(self) -> float | None:
        """Accepted draft tokens per draft token (None: nothing drafted)."""
        c = self.counters
        return c.accepted / c.draft_tokens if c.draft_tokens else None


async def _stream(
    client: httpx.AsyncClient, url: str, body: dict[str, object], on_tokens: Callable[[int], None]
) -> None:
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            usage = json.loads(line[6:]).get("usage")
            if usage:
                on_tokens(int(usage["completion_tokens"]))


async def acceptance_window(
    url: str,
    *,
    model: str,
    token: str,
    k_max: int,
    requests: int,
    max_tokens: int,
    leave: bool,
    version: int,
    timeout_s: float = 300.0,
) -> AcceptanceWindow:
    """``requests`` greedy streams from k = 0 (``leave``) or k_max; at half their tokens k goes to k_max (versions
    ``version`` and ``version + 1``); the counters over the rest of the batch."""
    half = max(1, max_tokens // 2)
    progress = [0] * requests
    reached = asyncio.Event()

    def tracker(i: int) -> Callable[[int], None]:
        def seen(tokens: int) -> None:
            progress[i] = tokens
            if min(progress) >= half:
                reached.set()

        return seen

    async with httpx.AsyncClient(timeout=timeout_s) as client:
        control = SpeculationClient(client, control_token=token)
        start_k = 0 if leave else k_max
        await control.update(url, SpeculationUpdate(k=start_k, version=version, lease_seconds=3600.0, reason="acc"))
        streams = [
            asyncio.create_task(
                _stream(
                    client,
                    url,
                    {
                        "model": model,
                        "prompt": batch_prompt(i),
                        "max_tokens": max_tokens,
                        "temperature": 0.0,
                        "ignore_eos": True,
                        "stream": True,
                        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                    },
                    tracker(i),
                )
            )
            for i in range(requests)
        ]
        await reached.wait()
        if leave:
            update = SpeculationUpdate(k=k_max, version=version + 1, lease_seconds=3600.0, reason="acc: return")
            await control.update(url, update)
        before, started = await read_counters(client, url), time.perf_counter()
        await asyncio.gather(*streams)
        after = await read_counters(client, url)
    return AcceptanceWindow(after - before, time.perf_counter() - started)


def _interval(bounds: tuple[float, float] | None, rounds: Sequence[float] | None) -> str:
    """``lo…hi``: the median's 95 % confidence interval, or the rounds' min…max (marked ``r:``) when the
    rounds are too few for one; "-" without rounds."""
    if bounds is not None:
        return f"{bounds[0]:+.1%}…{bounds[1]:+.1%}"
    if not rounds:
        return "-"
    return f"r:{min(rounds):+.1%}…{max(rounds):+.1%}"


def format_idle_tax(run: IdleTaxRun, batch_sizes: Sequence[int], *, method: str | None = None) -> str:
    """One row per batch size: each server's ms per token, the tax before (stock) and after (skip) as the median
    of the paired rounds, the skip's 95 % confidence interval of that median (the rounds' range below 6 rounds),
    the same in CPU time, drafts made at k = 0, and whether greedy outputs equal ``plain``'s; ``method`` (the
    speculative method the run used) heads each row when given."""
    lead, label = ("", "") if method is None else (f"{'method':<11} ", f"{method:<11} ")
    head = (
        f"{lead}{'batch':>5} {'plain ms/tok':>12} {'stock ms/tok':>12} {'skip ms/tok':>11} {'tax before':>10} "
        f"{'tax after':>9} {'after 95% CI':>15} {'CPU before':>10} {'CPU after':>9} {'CPU after 95% CI':>16} "
        f"{'rounds':>6} {'drafts':>6} {'same text':>9}"
    )
    lines = [head]
    for n in batch_sizes:
        stock, skip = run.tax("stock", n), run.tax("skip", n)
        wall_ci = _interval(skip.tax_interval, skip.round_taxes)
        cpu_ci = _interval(skip.cpu_tax_interval, skip.cpu_round_taxes)
        cpu_b = "-" if stock.cpu_tax is None else f"{stock.cpu_tax:+.1%}"
        cpu_a = "-" if skip.cpu_tax is None else f"{skip.cpu_tax:+.1%}"
        same = run.outputs_equal("skip", n) and run.outputs_equal("stock", n)
        lines.append(
            f"{label}{n:>5} {stock.tpot_without_s * 1e3:>12.3f} {stock.tpot_with_drafter_s * 1e3:>12.3f} "
            f"{skip.tpot_with_drafter_s * 1e3:>11.3f} {stock.tax:>+10.1%} {skip.tax:>+9.1%} {wall_ci:>15} "
            f"{cpu_b:>10} {cpu_a:>9} {cpu_ci:>16} {len(skip.round_taxes):>6} {stock.drafts + skip.drafts:>6.0f} "
            f"{'yes' if same else 'NO':>9}"
        )
    return "\n".join(lines)


def acceptance_change(never: AcceptanceWindow, back: AcceptanceWindow) -> float | None:
    """Acceptance after the return over a batch that never left, less 1 (None: either drafted nothing)."""
    a, b = never.rate, back.rate
    return None if a is None or b is None or a == 0 else b / a - 1


async def acceptance_check(
    urls: Mapping[str, str], *, model: str, token: str, k_max: int, requests: int, max_tokens: int
) -> list[tuple[str, AcceptanceWindow, AcceptanceWindow]]:
    """For each server of ``ACCEPTANCE_ARMS`` in ``urls``: a batch that never leaves k_max, then one that starts
    at k = 0 and returns at half (``acceptance_window``)."""
    rows = []
    common = {"model": model, "token": token, "k_max": k_max, "requests": requests, "max_tokens": max_tokens}
    for name in (a for a in ACCEPTANCE_ARMS if a in urls):
        never = await acceptance_window(urls[name], leave=False, version=100, **common)  # type: ignore[arg-type]
        back = await acceptance_window(urls[name], leave=True, version=101, **common)  # type: ignore[arg-type]
        rows.append((name, never, back))
    return rows


def format_acceptance(rows: Sequence[tuple[str, AcceptanceWindow, AcceptanceWindow]]) -> str:
    """Per server: acceptance in the window after k returned to k_max, against a run that never left, and whether
    it is within ``ACCEPTANCE_TOLERANCE`` (the ablation's row must say NO for the check to mean anything)."""
    lines = [
        f"{'server':>16} {'never left':>10} {'after return':>12} {'difference':>10} {'within 2%':>9} {'window s':>8}"
    ]
    for name, never, back in rows:
        a, b = never.rate, back.rate
        change = acceptance_change(never, back)
        diff = "-" if change is None else f"{change:+.2%}"
        within = "-" if change is None else ("yes" if change >= -ACCEPTANCE_TOLERANCE else "NO")
        fa = "-" if a is None else f"{a:.4f}"
        fb = "-" if b is None else f"{b:.4f}"
        lines.append(f"{name:>16} {fa:>10} {fb:>12} {diff:>10} {within:>9} {back.seconds:>8.1f}")
    return "\n".join(lines)
