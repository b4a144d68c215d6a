"""What prefix affinity loses under ``gearshift gateway --workers N``: each process keeps its own prefix index
(``gateway.routing.prefix``), so a turn routed by a process that has not seen its session's earlier turns is routed on
load alone.

The lab of ``bench.prefix`` (virtual time, simulated workers with prefix caching, the gateway's own router), with the
router split into ``processes`` gateway processes, each with its own index and its own view of the prompt tokens it
routed; each request goes to one of them uniformly at random, as SO_REUSEPORT spreads new connections (a client that
opens a connection per turn: the worst case; a keep-alive client's turns stay on one process and lose nothing). The
workers' in-flight counts are the fleet's in every process (a real process sees its own; that is the load view, not
the prefix loss measured here).

    python -m bench.gateway.prefix_split [--processes 2] [--sessions 48] [--duration-s 600]

prints one line per arm: hit rate, TTFT p50 of the turns after a session's first, busiest worker's share.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from dataclasses import replace

from bench.prefix import ArmResult, LabPrefixRouter, PrefixBenchConfig, _fleet, _summarise
from fleet.clock import ManualClock
from fleet.config import FleetConfig, TierConfig
from fleet.perf import load_profile
from gateway.routing.prefix import PrefixIndex
from gateway.settings import GatewaySettings
from workers.sim.arrivals import RequestSpec
from workers.sim.sessions import SessionLoad
from workers.sim.virtual import VirtualLab, VirtualWorker, make_worker


class SplitPrefixRouter:
    """``processes`` lab routers, each with its own prefix index; each request is routed by one chosen at random."""

    def __init__(self, fleet: FleetConfig, clock: ManualClock, *, processes: int, seed: int, tier: TierConfig) -> None:
        s = GatewaySettings()
        self._routers = [
            LabPrefixRouter(fleet, clock, index=PrefixIndex(ttl_s=s.prefix_ttl_s, capacity=s.prefix_index_blocks),
                            load_factor=s.prefix_load_factor)
            for _ in range(processes)
        ]  # fmt: skip
        for router in self._routers:
            router.tier = tier
        self._rng = random.Random(seed)

    def choose(self, workers: Sequence[VirtualWorker], spec: RequestSpec) -> int:
        return self._rng.choice(self._routers).choose(workers, spec)

    def close(self) -> None:
        for router in self._routers:
            router.close()


def run_split(config: PrefixBenchConfig, processes: int) -> ArmResult:
    """The ``affinity`` arm of ``bench.prefix`` with the index split over ``processes`` (1: the arm itself)."""
    clock = ManualClock()
    fleet = _fleet(config)
    profile = load_profile(config.profile)
    workers = [
        make_worker(profile, w.id, clock, max_num_seqs=config.max_num_seqs, scheduling="priority", seed=i)
        for i, w in enumerate(fleet.workers)
    ]
    router = SplitPrefixRouter(fleet, clock, processes=processes, seed=config.seed, tier=config.tier)
    load = SessionLoad(replace(config.shape, tag="agent"), concurrency=config.sessions, duration_s=config.duration_s,
                       seed=config.seed)  # fmt: skip
    lab = VirtualLab(workers, load, clock=clock, seed=config.seed, router=router)
    try:
        records = lab.run(config.duration_s)
    finally:
        router.close()
    return _summarise(config, f"affinity, {processes} process{'es' if processes > 1 else ''}", records, workers)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--sessions", type=int, default=PrefixBenchConfig.sessions)
    parser.add_argument("--duration-s", type=float, default=PrefixBenchConfig.duration_s)
    args = parser.parse_args(argv)
    config = PrefixBenchConfig(sessions=args.sessions, duration_s=args.duration_s,
                               warmup_s=min(PrefixBenchConfig.warmup_s, args.duration_s / 5))  # fmt: skip
    for n in args.processes:
        r = run_split(config, n)
        line = f"{r.arm}: hit rate {r.hit_rate:.3f}, later-turn TTFT p50 {r.ttft_later_p50_s:.3f} s, "
        line += f"TTFT p99 {r.ttft_p99_s:.3f} s, busiest share {r.busiest_share:.3f}, requests {r.requests}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
