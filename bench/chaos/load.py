"""Bounded streaming load on the gateway replicas: looping clients per tenant until a stop event, a deadline or a
request cap, whichever comes first. A client skips a replica the bench has marked down (the way a load
balancer's readiness check would), and a share of the streams can be dropped after their first token (a client
that disconnects mid-stream). Times are ``time.monotonic()`` seconds."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

from bench.chaos.stack import MODEL, tenant_id
from bench.soak.client import StreamResult, stream_chat


@dataclass(frozen=True, slots=True)
class ClientGroup:
    """``clients`` looping clients of one tenant role, each request asking for ``max_tokens`` tokens."""

    role: str
    clients: int
    max_tokens: int


DEFAULT_GROUPS: tuple[ClientGroup, ...] = (
    ClientGroup("free", clients=6, max_tokens=48),
    ClientGroup("rpm", clients=2, max_tokens=4),
    ClientGroup("tpm", clients=2, max_tokens=48),
    ClientGroup("conc", clients=4, max_tokens=32),
    ClientGroup("budget", clients=2, max_tokens=16),
)


@dataclass(slots=True)
class Sent:
    """One request as its client saw it, and where it went."""

    role: str
    gateway: int
    result: StreamResult
    disconnected: bool = False
    """The client dropped the stream after its first token, on purpose."""


class _Disconnect(Exception):
    pass


PROMPT_WORDS = 12


def body(max_tokens: int, model: str = MODEL) -> dict[str, object]:
    """The chat body the clients send: one fixed prompt (so the gateway's estimate of it is known), exactly
    ``max_tokens`` tokens back."""
    prompt = " ".join(["chaos"] * PROMPT_WORDS)
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }


@dataclass
class Load:
    """The load of one fault: its tenants' keys, where to send, and what came back (``sent``)."""

    fault: str
    keys: dict[str, str]
    urls: list[str]
    groups: Sequence[ClientGroup] = DEFAULT_GROUPS
    max_requests: int = 20_000
    request_timeout_s: float = 30.0
    seed: int = 0
    down: set[int] = field(default_factory=set)
    """Replicas the clients skip now (a restart in progress, or a kill noticed)."""
    disconnect_share: float = 0.0
    """Share of the streams that start now which the client drops after the first token."""
    model: str = MODEL
    sent: list[Sent] = field(default_factory=list)

    async def run(self, stop: asyncio.Event, *, deadline_s: float) -> None:
        """Drive every group until ``stop`` is set or ``deadline_s`` (monotonic) passes."""
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            tasks = [
                self._client(session, group, i, stop, deadline_s) for group in self.groups for i in range(group.clients)
            ]
            await asyncio.gather(*tasks)

    def _pick(self, rng: random.Random) -> int | None:
        up = [i for i in range(len(self.urls)) if i not in self.down]
        return rng.choice(up) if up else None

    async def _client(
        self, session: aiohttp.ClientSession, group: ClientGroup, i: int, stop: asyncio.Event, deadline_s: float
    ) -> None:
        rng = random.Random(f"{self.seed}/{self.fault}/{group.role}/{i}")
        key = self.keys[tenant_id(self.fault, group.role)]
        while not stop.is_set() and time.monotonic() < deadline_s and len(self.sent) < self.max_requests:
            gateway = self._pick(rng)
            if gateway is None:
                await asyncio.sleep(0.05)
                continue
            drop = rng.random() < self.disconnect_share
            seen: list[StreamResult] = []

            def progress(r: StreamResult, drop: bool = drop, seen: list[StreamResult] = seen) -> None:
                seen[:] = [r]
                if drop and r.content_events >= 1:
                    raise _Disconnect

            req = body(group.max_tokens, self.model)
            try:
                result = await stream_chat(
                    session, self.urls[gateway], key=key, body=req, timeout_s=self.request_timeout_s,
                    progress=progress,
                )  # fmt: skip
                self.sent.append(Sent(group.role, gateway, result))
            except _Disconnect:
                self.sent.append(Sent(group.role, gateway, seen[0], disconnected=True))
                continue
            if result.status == 429:
                retry = float(result.headers.get("retry-after", "1") or 1)
                await asyncio.sleep(min(retry, 1.0))
            elif not result.ok:
                await asyncio.sleep(0.05)  # never spin on a failing replica
