"""The worker as the profiler sees it: ``/metrics``, ``/v1/models``, the speculation-control API (DESIGN §3.1)
and bounded streaming completions, over one ``httpx.AsyncClient``."""

from __future__ import annotations

import asyncio

import httpx

from fleet.scrape import WorkerScrape, parse_worker_metrics
from fleet.speculation import SPECULATION_PATH, SpeculationState, SpeculationUpdate
from fleet.speculation_client import SpeculationCallError, SpeculationClient


class ProfilerError(RuntimeError):
    """The worker refused or misbehaved; the message names the request and what came back."""


class WorkerClient:
    """Talks to one worker at ``base_url`` (``http://host:port``)."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, *, control_token: str) -> None:
        self._client = client
        self._base = base_url.rstrip("/")
        self._control = SpeculationClient(client, control_token=control_token)

    async def snapshot(self) -> WorkerScrape:
        """The worker's counters now (summed over its engines and models; times on the worker's clock)."""
        response = await self._client.get(f"{self._base}/metrics")
        _check(response, "GET /metrics")
        return parse_worker_metrics(response.text)

    async def model(self) -> str:
        """The first served model's id."""
        response = await self._client.get(f"{self._base}/v1/models")
        _check(response, "GET /v1/models")
        data = response.json()["data"]
        if not data:
            raise ProfilerError("GET /v1/models: the worker serves no model")
        return str(data[0]["id"])

    async def speculation(self) -> SpeculationState:
        try:
            return await self._control.state(self._base)
        except SpeculationCallError as exc:
            raise ProfilerError(str(exc)) from exc

    async def set_k(self, k: int, *, lease_s: float) -> SpeculationState:
        """Apply k to every batch size under a new version, then confirm it with a GET."""
        version = (await self.speculation()).version + 1
        return await self.apply(SpeculationUpdate(k=k, version=version, lease_seconds=lease_s, reason="profile"))

    async def set_fallback(self, schedule: list[list[int]], *, version: int) -> SpeculationState:
        """Put the worker back on its start-up (fallback) schedule."""
        update = SpeculationUpdate(schedule=schedule, version=version, reason="profile done: start-up schedule")
        return await self.apply(update)

    async def apply(self, update: SpeculationUpdate) -> SpeculationState:
        """PUT ``update``, then confirm with a GET that the worker holds its version."""
        try:
            await self._control.update(self._base, update)
        except SpeculationCallError as exc:
            raise ProfilerError(str(exc)) from exc
        state = await self.speculation()
        if state.version != update.version:
            raise ProfilerError(
                f"PUT {SPECULATION_PATH}: version {update.version} applied but GET shows {state.version}"
            )
        return state

    async def stream(
        self, *, model: str, prompt: str, max_tokens: int, temperature: float, first: asyncio.Event
    ) -> None:
        """One streaming completion of exactly ``max_tokens`` tokens (``ignore_eos``); sets ``first`` at the
        first event. Cancel the task to abandon it (the worker aborts a request whose client went away)."""
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "ignore_eos": True,
            "stream": True,
        }
        async with self._client.stream("POST", f"{self._base}/v1/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                _check(response, "POST /v1/completions")
            events, last = 0, ""
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    events += 1
                    first.set()
                last = line or last
        if events == 0 or '"error"' in last:
            raise ProfilerError(
                f"POST /v1/completions: the stream ended after {events} events; last line {last[:300]!r}"
            )


def _check(response: httpx.Response, what: str) -> None:
    if response.status_code != 200:
        raise ProfilerError(f"{what}: HTTP {response.status_code}: {response.text[:500]}")
