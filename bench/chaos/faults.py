"""The fault matrix: each fault is injected into the running stack while load runs, held for ``during_s`` seconds,
then healed (the killed process started again, the proxy back to pass-through, the skew removed). Blocking
process work runs in a thread so the load never stops.

Faults that cannot be injected here are listed in ``NOT_INJECTED`` with the reason."""

from __future__ import annotations

import asyncio
import signal
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime

from bench.chaos.load import Load
from bench.chaos.measure import Kill, Skew
from bench.chaos.proxy import Mode
from bench.chaos.stack import ChaosStack
from bench.procs import redis_cluster_ok

NOTICE_S = 1.0
"""How long after a replica's SIGKILL the clients stop sending to it (a load balancer's readiness check)."""
SKEW_S = 2.0
SLOW_DELAY_S = 0.2
"""Seconds the slow worker adds before every chunk it sends."""
DISCONNECT_SHARE = 0.1


@dataclass
class FaultRun:
    """One fault's injection in progress: the stack, the load, the kills, and what the fault noted."""

    stack: ChaosStack
    load: Load
    kills: list[Kill] = field(default_factory=list)
    skews: list[Skew] = field(default_factory=list)
    """Which requests a replica with a skewed clock served (``measure.on_one_clock``)."""
    notes: list[str] = field(default_factory=list)
    state: dict[str, object] = field(default_factory=dict)


Step = Callable[[FaultRun], Awaitable[None]]


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    during_s: float
    inject: Step
    heal: Step
    store_lost: bool = False
    """The store (or the part holding some tenant's keys) does not answer for a while: the outage bounds apply."""
    stack: str = "main"
    """The stack configuration it runs on: ``main``, or ``restarts`` (``bench.chaos.restarts``)."""


def _cluster_ok(stack: ChaosStack) -> bool:
    return all(redis_cluster_ok(n.port) for n in stack.cluster.nodes if n.alive())


async def _wait(check: Callable[[], bool], timeout_s: float) -> float | None:
    """Seconds until ``check()`` (run in a thread) holds, polled every 0.1 s; None after ``timeout_s``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if await asyncio.to_thread(check):
            return time.monotonic() - t0
        await asyncio.sleep(0.1)
    return None


def _took(what: str, seconds: float | None) -> str:
    return f"{what} in {seconds:.1f} s" if seconds is not None else f"{what}: not within the wait"


# Redis master killed ------------------------------------------------------------------------------------------------
VICTIM_NODE = 1
"""A master that is not the startup node every process was given."""


async def _kill_master(run: FaultRun) -> None:
    run.stack.cluster.nodes[VICTIM_NODE].kill()
    run.state["killed_at"] = time.monotonic()


async def _restart_master(run: FaultRun) -> None:
    await asyncio.to_thread(run.stack.restart_redis_node, VICTIM_NODE)
    took = await _wait(lambda: _cluster_ok(run.stack), 30.0)
    run.notes.append(_took("the killed master rejoined (as a replica) and the cluster reports ok", took))


# Store unreachable --------------------------------------------------------------------------------------------------
async def _pause_store(run: FaultRun) -> None:
    for node in run.stack.cluster.nodes:
        node.pause()


async def _resume_store(run: FaultRun) -> None:
    for node in run.stack.cluster.nodes:
        node.resume()
    took = await _wait(lambda: _cluster_ok(run.stack), 60.0)
    run.notes.append(_took("every node answered again with cluster_state:ok", took))


# Worker SIGKILLed mid-stream ---------------------------------------------------------------------------------------
async def _kill_worker(run: FaultRun) -> None:
    run.stack.sims[0].kill()


async def _restart_worker(run: FaultRun) -> None:
    await asyncio.to_thread(run.stack.restart_sim, 0)
    run.notes.append("w0 started again on its port")


# Slow and garbage worker --------------------------------------------------------------------------------------------
def _proxy_mode(mode: Mode, delay_s: float = 0.0) -> Step:
    async def step(run: FaultRun) -> None:
        run.stack.proxy.delay_s = delay_s
        run.stack.proxy.mode = mode

    return step


# Gateway replica SIGKILLed ------------------------------------------------------------------------------------------
KILLED_GATEWAY = 1


async def _kill_gateway(run: FaultRun) -> None:
    at = time.monotonic()
    run.stack.gateways[KILLED_GATEWAY].kill()
    await asyncio.sleep(NOTICE_S)
    run.load.down.add(KILLED_GATEWAY)
    run.kills.append(Kill(KILLED_GATEWAY, at=at, noticed_at=time.monotonic()))


async def _restart_gateway(run: FaultRun) -> None:
    await asyncio.to_thread(run.stack.restart_gateway, KILLED_GATEWAY)
    run.load.down.discard(KILLED_GATEWAY)
    run.notes.append("gateway-1 started again on its port and spool")


# Controller leader SIGKILLed ----------------------------------------------------------------------------------------
async def _kill_leader(run: FaultRun) -> None:
    holder = await run.stack.store.lease_holder("controller")
    leader = next((c for c in run.stack.controllers if c.alive() and c.name == holder), None)
    if leader is None:
        run.notes.append(f"no live controller held the lease (holder {holder!r}): nothing killed")
        return
    at = time.monotonic()
    leader.send(signal.SIGKILL)
    run.state["leader"] = leader.name
    while time.monotonic() - at < 30.0:
        now_holder = await run.stack.store.lease_holder("controller")
        if now_holder is not None and now_holder != leader.name:
            run.notes.append(f"{leader.name} killed; {now_holder} took the lease {time.monotonic() - at:.1f} s later")
            return
        await asyncio.sleep(0.1)
    run.notes.append(f"{leader.name} killed; no standby took the lease within 30 s")


async def _replace_controller(run: FaultRun) -> None:
    name = f"ctl-{len(run.stack.controllers)}"
    await asyncio.to_thread(run.stack.start_controller, name)
    run.notes.append(f"{name} started as the new standby")


# Clock skew ---------------------------------------------------------------------------------------------------------
SKEWED_GATEWAY = 1


def _date_offset_s(url: str) -> float | None:
    """How far the ``Date`` header of ``url``'s ``/healthz`` is from this clock, seconds (whole-second
    resolution: the evidence that the skew took hold)."""
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=2.0) as resp:
            date = resp.headers.get("date")
    except OSError:
        return None
    return None if date is None else parsedate_to_datetime(date).timestamp() - time.time()


def _restart_skewed(skew_s: float) -> Step:
    async def step(run: FaultRun) -> None:
        run.load.down.add(SKEWED_GATEWAY)
        since, offset = run.state.pop("skewed_since", None), run.state.pop("skew_s", None)
        if isinstance(since, float) and isinstance(offset, float):  # what the clients started on the skewed one
            run.skews.append(Skew(SKEWED_GATEWAY, since, time.monotonic(), offset))
        await asyncio.sleep(0.5)  # the clients stop picking it; what is in flight finishes on SIGTERM
        proc = await asyncio.to_thread(run.stack.restart_gateway, SKEWED_GATEWAY, skew_s=skew_s)
        if skew_s:
            run.state["skewed_since"], run.state["skew_s"] = time.monotonic(), skew_s
        run.load.down.discard(SKEWED_GATEWAY)
        seen = await asyncio.to_thread(_date_offset_s, proc.url)
        shown = "unread" if seen is None else f"{seen:+.0f} s"
        run.notes.append(f"gateway-1 restarted with its clock {skew_s:+.1f} s off (its Date header: {shown})")

    return step


# Client disconnects -------------------------------------------------------------------------------------------------
def _disconnects(share: float) -> Step:
    async def step(run: FaultRun) -> None:
        run.load.disconnect_share = share

    return step


FAULTS: tuple[Fault, ...] = (
    Fault("redis-master", "a Redis Cluster master SIGKILLed; restarted after", 10.0, _kill_master, _restart_master,
          store_lost=True),
    Fault("store-down", "every Redis node SIGSTOPped for 30 s (connections accepted, nothing answers)", 30.0,
          _pause_store, _resume_store, store_lost=True),
    Fault("worker-kill", "worker w0 SIGKILLed with streams in flight; restarted after", 8.0, _kill_worker,
          _restart_worker),
    Fault("slow-worker", f"worker w3 adds {SLOW_DELAY_S:g} s before every chunk", 10.0,
          _proxy_mode(Mode.SLOW, SLOW_DELAY_S), _proxy_mode(Mode.OK)),
    Fault("garbage-worker", "worker w3 answers 200 with bytes that are neither JSON nor SSE", 8.0,
          _proxy_mode(Mode.GARBAGE), _proxy_mode(Mode.OK)),
    Fault("gateway-kill", "gateway-1 SIGKILLed under load (clients skip it 1 s later); restarted on its spool",
          6.0, _kill_gateway, _restart_gateway),
    Fault("controller-kill", "the controller holding the leader lease SIGKILLed; a replacement standby started",
          4.0, _kill_leader, _replace_controller),
    Fault("clock-skew", f"gateway-1 restarted with its wall clock {SKEW_S:+g} s off, then back", 15.0,
          _restart_skewed(SKEW_S), _restart_skewed(0.0)),
    Fault("disconnects", f"{DISCONNECT_SHARE:.0%} of the streams dropped by the client after the first token",
          12.0, _disconnects(DISCONNECT_SHARE), _disconnects(0.0)),
)  # fmt: skip
FAST: tuple[str, ...] = ("redis-master", "worker-kill", "garbage-worker", "gateway-kill", "disconnects")
"""The CI subset (``--fast``)."""

NOT_INJECTED: tuple[tuple[str, str], ...] = ()
"""Faults of issue 23's matrix that this bench cannot inject, with why (none: the supervisor's restart failing and
the supervisor unreachable run on a stack of their own, ``bench.chaos.restarts``)."""


def all_faults() -> tuple[Fault, ...]:
    """The main stack's matrix, then the restart faults (their own stack, ``bench.chaos.restarts``)."""
    from bench.chaos.restarts import RESTART_FAULTS  # it builds on this module

    return FAULTS + RESTART_FAULTS


def by_name(names: list[str] | None) -> list[Fault]:
    """The faults named (all when None), in matrix order; a KeyError names an unknown one."""
    every = all_faults()
    if names is None:
        return list(every)
    known = {f.name: f for f in every}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise KeyError(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [f for f in every if f.name in names]
