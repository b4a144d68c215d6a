"""The supervisor of a headless node (issue 27): on an engine that spans several nodes (tensor parallel 16 over
two pods of a LeaderWorkerSet group), node 0's supervisor (``workers.vllm.supervisor``) restarts its vLLM with or
without the drafter; every other node must restart with it, in the same mode, or the group's engine cannot form.

A ``Follower`` runs its node's headless vLLM and reads the leader supervisor's ``GET /gearshift/v1/restart``
(``fleet.restart``) every ``poll_s``. Each leader restart (``restarts`` counts finished ones, ``restarting`` the one
under way, ``drafter`` the mode it runs or is starting in) is one generation; when the generation changes, the
follower stops its vLLM and starts it in the leader's mode, so the leader's new vLLM finds its peer. A vLLM that
exits by itself (its leader went away) is started again. An unanswered read changes nothing: the leader's
supervisor serves only once its vLLM is up, which needs this node's. Headless vLLM serves no HTTP, so a start is
not waited on.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from fleet.clock import Clock
from fleet.restart import RestartCallError, RestartClient, RestartState
from workers.vllm.spawn import VllmProcess, log_path
from workers.vllm.supervisor import PlanFor

log = logging.getLogger("gearshift.vllm.follower")

Generation = tuple[int, bool]
"""(leader restarts begun, leader mode: drafter loaded)."""


def generation(state: RestartState) -> Generation:
    return state.restarts + int(state.restarting), state.drafter


class Follower:
    """One headless vLLM process kept in its leader's mode and restarted with each of the leader's restarts."""

    def __init__(
        self,
        plan_for: PlanFor,
        *,
        leader: RestartClient,
        leader_url: str,
        log_dir: Path,
        clock: Clock,
        poll_s: float = 2.0,
        stop_timeout_s: float = 60.0,
    ) -> None:
        self.plan_for = plan_for
        self.leader = leader
        self.leader_url = leader_url
        self.log_dir = log_dir
        self.clock = clock
        self.poll_s = poll_s
        self.stop_timeout_s = stop_timeout_s
        self.drafter = True
        """The mode its vLLM runs in (a group starts with its drafter)."""
        self.starts = 0
        self.seen: Generation | None = None
        self.vllm = VllmProcess()

    def start(self) -> None:
        self.vllm.start(self.plan_for(self.drafter), log=log_path(self.log_dir, self.starts, drafter=self.drafter))
        self.starts += 1

    def stop(self) -> None:
        self.vllm.stop(timeout_s=self.stop_timeout_s)

    @property
    def running(self) -> bool:
        return self.vllm.running

    async def step(self) -> None:
        """One look at the leader: restart in its mode on a new generation, or start again if vLLM has exited."""
        try:
            state: RestartState | None = await self.leader.state(self.leader_url)
        except RestartCallError:
            state = None
        if state is not None and generation(state) != self.seen:
            first = self.seen is None
            self.seen = generation(state)
            if not first or state.drafter != self.drafter:
                log.info("leader restart %d: restarting this node's vLLM (drafter: %s)", self.seen[0], state.drafter)
                await asyncio.to_thread(self.stop)
                self.drafter = state.drafter
                await asyncio.to_thread(self.start)
                return
        if not self.running:
            log.warning("this node's vLLM exited; starting it again (drafter: %s)", self.drafter)
            await asyncio.to_thread(self.stop)
            await asyncio.to_thread(self.start)

    async def run(self, stop: asyncio.Event) -> None:
        """Start vLLM and follow the leader until ``stop``; then stop vLLM."""
        await asyncio.to_thread(self.start)
        try:
            while not stop.is_set():
                await self.step()
                sleep = asyncio.ensure_future(self.clock.sleep(self.poll_s))
                stopped = asyncio.ensure_future(stop.wait())
                await asyncio.wait({sleep, stopped}, return_when=asyncio.FIRST_COMPLETED)
                for task in (sleep, stopped):
                    task.cancel()
        finally:
            await asyncio.to_thread(self.stop)
