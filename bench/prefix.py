"""``gearshift bench prefix``: multi-turn agentic sessions with and without the gateway's prefix affinity
(``gateway.routing.prefix``) → ``docs/benchmarks/prefix.md`` + ``prefix.png``.

Simulated workers (the default profile, the recipe's ``max_num_seqs``, prefix caching on: ``workers.sim.prefix_cache``)
run in virtual time under ``workers.sim.sessions.SessionLoad``: closed-loop sessions whose turns extend the previous
prompt and answer, all sharing one system prompt. Each arrival is routed by the gateway's own router
(``gateway.routing.router.default_router``, the gateway's default weights, no controller, so every worker runs at its
start-up k) fed the same views the gateway builds: in-flight requests and outstanding prompt tokens per worker. The
arms differ only in the prefix scorer:

- ``off``: no prefix scorer (``weight_prefix`` 0);
- ``affinity``: the gateway's defaults (weight, TTL, ``load_factor`` 2);
- ``affinity-unbounded``: the same without the load bound, to show what the bound is for.

The lab hands the scorer the blocks the gateway would hash: one per 128 tokens (the gateway's 512 characters at 4 a
token), at most ``prefix_max_blocks``. Reported over the requests that arrived after the warm-up and finished: TTFT
p50/p99, output throughput, the engines' prefix-cache hit rate (``vllm:prefix_cache_hits`` / ``queries``), the
busiest worker's share of requests, and $/Mtok: the fleet's GPU cost over the measured window divided by the output
tokens of the steps that ended in it (idle time included, as an operator pays for it).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.markdown import fmt, pct, table
from fleet.clock import ManualClock
from fleet.config import FleetConfig, ModelConfig, TierConfig, WorkerConfig
from fleet.perf import load_profile
from fleet.stats import percentile
from gateway.routing.context import RouteContext
from gateway.routing.pool import WorkerView
from gateway.routing.prefix import PrefixIndex
from gateway.routing.router import Router, default_router
from gateway.settings import GatewaySettings
from workers.sim.arrivals import RequestSpec
from workers.sim.records import RunRecords
from workers.sim.sessions import SessionLoad, SessionShape
from workers.sim.virtual import VirtualLab, VirtualWorker, make_worker

MODEL = "kimi-k3"
GATEWAY_BLOCK_TOKENS = 128
"""Tokens per block the gateway hashes (512 characters at 4 characters a token)."""
ARMS = ("off", "affinity", "affinity-unbounded")


@dataclass(frozen=True)
class PrefixBenchConfig:
    profile: str = "kimi-k3-dspark-tp16"
    workers: int = 4
    max_num_seqs: int = 32
    """The recipe's ``--max-num-seqs`` when speculating."""
    sessions: int = 48
    """Concurrent sessions (closed-loop streams) over the fleet."""
    sweep: tuple[int, ...] = (8, 16, 96)
    """Further session counts, reported in a second table (light to heavy load)."""
    shape: SessionShape = field(default_factory=SessionShape)
    duration_s: float = 600.0
    warmup_s: float = 120.0
    seed: int = 1
    tier: TierConfig = field(default_factory=lambda: TierConfig(ttft_target_s=2.0))


@dataclass(frozen=True)
class ArmResult:
    arm: str
    ttft_p50_s: float
    ttft_p99_s: float
    ttft_later_p50_s: float
    """TTFT p50 of the turns after a session's first (the ones a prefix can help)."""
    tpot_p50_s: float
    requests: int
    throughput_tok_s: float
    hit_rate: float
    busiest_share: float
    usd_per_mtok: float


class LabPrefixRouter:
    """A lab ``Router``: the gateway's router on the gateway's views, plus (unless ``index`` is None) the prefix
    scorer over the index of what was routed where."""

    def __init__(
        self, fleet: FleetConfig, clock: ManualClock, *, index: PrefixIndex | None, load_factor: float
    ) -> None:
        s = GatewaySettings()
        self._settings = s
        routing = s.model_copy(update={"prefix_load_factor": load_factor})
        self._router: Router = default_router(routing, fleet, prefix=index, rng=random.Random(0))
        self._index = index
        self._configs = {w.id: w for w in fleet.workers}
        self._clock = clock
        self._loop = asyncio.new_event_loop()
        self._routed_prompt: dict[str, int] = {}
        self.tier = TierConfig()

    def _blocks(self, spec: RequestSpec) -> tuple[int, ...]:
        if self._index is None:
            return ()
        step = GATEWAY_BLOCK_TOKENS // 16
        return tuple(spec.block_hashes[step - 1 :: step][: self._settings.prefix_max_blocks])

    def choose(self, workers: Sequence[VirtualWorker], spec: RequestSpec) -> int:
        views = [
            WorkerView(
                config=self._configs[w.worker_id],
                in_flight=w.outstanding,
                prefill_tokens=max(0, self._routed_prompt.get(w.worker_id, 0) - w.engine.stats.prompt_tokens),
            )
            for w in workers
        ]
        now = self._clock.wall()
        blocks = self._blocks(spec)
        ctx = RouteContext(model=MODEL, tier=self.tier, now=now, prompt_tokens=spec.prompt_tokens, prefix_blocks=blocks)
        decision = self._loop.run_until_complete(self._router.route(ctx, views))
        chosen = decision.ranked[0].id
        index = next(i for i, w in enumerate(workers) if w.worker_id == chosen)
        self._routed_prompt[chosen] = self._routed_prompt.get(chosen, 0) + spec.prompt_tokens
        if self._index is not None and blocks:
            self._index.record(blocks, chosen, now)
        return index

    def close(self) -> None:
        self._loop.close()


def _fleet(config: PrefixBenchConfig) -> FleetConfig:
    workers = tuple(
        WorkerConfig(id=f"w{i}", url=f"http://127.0.0.1:{9000 + i}", model=MODEL, max_num_seqs=config.max_num_seqs)
        for i in range(config.workers)
    )
    return FleetConfig(models=(ModelConfig(name=MODEL, profile=config.profile),), workers=workers)


def run_arm(config: PrefixBenchConfig, arm: str) -> tuple[ArmResult, RunRecords]:
    """One arm in virtual time; deterministic for a config."""
    profile = load_profile(config.profile)
    clock = ManualClock()
    fleet = _fleet(config)
    workers = [
        make_worker(profile, w.id, clock, max_num_seqs=config.max_num_seqs, scheduling="priority", seed=i)
        for i, w in enumerate(fleet.workers)
    ]
    s = GatewaySettings()
    index = None if arm == "off" else PrefixIndex(ttl_s=s.prefix_ttl_s, capacity=s.prefix_index_blocks)
    factor = s.prefix_load_factor if arm == "affinity" else math.inf
    router = LabPrefixRouter(fleet, clock, index=index, load_factor=factor)
    router.tier = config.tier
    shape = replace(config.shape, tag="agent")
    load = SessionLoad(shape, concurrency=config.sessions, duration_s=config.duration_s, seed=config.seed)
    lab = VirtualLab(workers, load, clock=clock, seed=config.seed, router=router)
    try:
        records = lab.run(config.duration_s)
    finally:
        router.close()
    return _summarise(config, arm, records, workers), records


def _summarise(config: PrefixBenchConfig, arm: str, records: RunRecords, workers: Sequence[VirtualWorker]) -> ArmResult:
    start, end = config.warmup_s, config.duration_s
    done = records.finished(arrived_from_s=start)
    ttft = [r.ttft_s for r in done]
    later = [r.ttft_s for r in done if r.phase != "turn-0"]
    per_worker = [sum(1 for r in done if r.worker_id == w.worker_id) for w in workers]
    queries = sum(w.stats.prefix_cache_queries for w in workers)
    hits = sum(w.stats.prefix_cache_hits for w in workers)
    tokens = records.output_tokens(start, end)
    profile = load_profile(config.profile)
    usd = config.workers * (end - start) * profile.hardware.gpus * _usd_per_gpu_hour() / 3600.0
    return ArmResult(
        arm=arm,
        ttft_p50_s=percentile(ttft, 0.5),
        ttft_p99_s=percentile(ttft, 0.99),
        ttft_later_p50_s=percentile(later, 0.5),
        tpot_p50_s=percentile([r.tpot_s for r in done if not math.isnan(r.tpot_s)], 0.5),
        requests=len(done),
        throughput_tok_s=tokens / (end - start),
        hit_rate=hits / queries if queries else 0.0,
        busiest_share=max(per_worker) / max(sum(per_worker), 1),
        usd_per_mtok=usd / tokens * 1e6 if tokens else math.nan,
    )


def _usd_per_gpu_hour() -> float:
    """The fleet file's default price of a GPU hour (``WorkerConfig.usd_per_gpu_hour``)."""
    return WorkerConfig(id="w", url="http://x", model=MODEL).usd_per_gpu_hour


def _sweep_table(swept: Sequence[tuple[int, ArmResult]]) -> str:
    header = ["sessions", "arm", "TTFT p50 (s)", "TTFT p99 (s)", "TPOT p50 (ms)", "hit rate", "busiest share", "$/Mtok"]
    rows = [
        [n, r.arm, fmt(r.ttft_p50_s), fmt(r.ttft_p99_s), fmt(r.tpot_p50_s * 1e3), pct(r.hit_rate),
         pct(r.busiest_share), fmt(r.usd_per_mtok)]
        for n, r in swept
    ]  # fmt: skip
    return table(header, rows, align="rlrrrrrr")


def report(
    config: PrefixBenchConfig,
    results: Sequence[ArmResult],
    *,
    command: str,
    load: str,
    swept: Sequence[tuple[int, ArmResult]] = (),
) -> str:
    shape = config.shape
    header = ["arm", "TTFT p50 (s)", "TTFT p99 (s)", "later turns TTFT p50 (s)", "TPOT p50 (ms)", "requests",
              "output tok/s", "prefix-cache hit rate", "busiest worker's share", "$/Mtok"]  # fmt: skip
    rows = [
        [r.arm, fmt(r.ttft_p50_s), fmt(r.ttft_p99_s), fmt(r.ttft_later_p50_s), fmt(r.tpot_p50_s * 1e3), r.requests,
         fmt(r.throughput_tok_s), pct(r.hit_rate), pct(r.busiest_share), fmt(r.usd_per_mtok)]
        for r in results
    ]  # fmt: skip
    base = results[0]
    ratios = [
        f"- `{r.arm}` vs `off`: TTFT p50 ×{fmt(r.ttft_p50_s / base.ttft_p50_s)}, "
        f"p99 ×{fmt(r.ttft_p99_s / base.ttft_p99_s)}, $/Mtok ×{fmt(r.usd_per_mtok / base.usd_per_mtok)}"
        for r in results[1:]
    ]
    return "\n".join(
        [
            "# Prefix affinity on multi-turn agentic sessions",
            "",
            f"Command: `{command}`. Virtual time (deterministic for the seed; the machine's load, `{load}`, does not",
            "change the figures). Method: `bench/prefix.py`'s docstring.",
            "",
            f"Fleet: {config.workers} simulated workers of profile `{config.profile}`, "
            f"`max_num_seqs` {config.max_num_seqs}, prefix caching on, KV cache as the profile sizes it, start-up k,",
            "no controller.",
            f"Load: {config.sessions} concurrent sessions of {shape.turns} turns; a {shape.shared_tokens}-token prefix "
            f"shared by every session, a first message of ~{fmt(shape.first_tokens.mean)} tokens, then per turn",
            f"the answer (~{fmt(shape.answer_tokens.mean)} tokens) and ~{fmt(shape.turn_tokens.mean)} new tokens, "
            f"{fmt(shape.think_s)} s after the answer.",
            f"Measured: requests that arrived in [{fmt(config.warmup_s)}, {fmt(config.duration_s)}] s and finished.",
            "",
            table(header, rows, align="lrrrrrrrrr"),
            "",
            *ratios,
            "",
            f"Without affinity the hit rate is not zero: the shared {shape.shared_tokens}-token beginning is cached on",
            f"every worker, and a turn lands on its session's worker by chance (about 1 in {config.workers}). Without",
            "its load bound the scorer sends most sessions to the workers that first cached the shared beginning:",
            "the busiest worker's share and the TPOT show the price.",
            "",
            *(
                [
                    "## Other loads",
                    "",
                    "The same sessions, fewer or more of them at once. The load bound trades: at light load it keeps",
                    "sessions from piling onto the workers that cached the shared beginning first (busiest share,",
                    "TPOT); when every worker is busy it also turns away turns whose prefix would have paid.",
                    "",
                    _sweep_table(swept),
                    "",
                ]
                if swept
                else []
            ),
            "![TTFT per arm](prefix.png)",
            "",
            "Caveats: the simulator caches every prompt block, as vLLM does for attention layers; Kimi K3's",
            "linear-attention (KDA) layers keep a per-request state that vLLM can only reuse at block boundaries",
            "it saved, which the simulator does not model (ASSUMED: full reuse). A prefill of the uncached part is",
            "timed as if it had no cached context to attend to. The gateway's own prefix index is approximate; here",
            "it sees exactly what was routed, as one gateway replica would.",
            "",
        ]
    )


def plot(results: Sequence[ArmResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    names = [r.arm for r in results]
    x = range(len(names))
    ax1.bar([i - 0.2 for i in x], [r.ttft_p50_s for r in results], 0.4, label="p50")
    ax1.bar([i + 0.2 for i in x], [r.ttft_p99_s for r in results], 0.4, label="p99")
    ax1.set_xticks(list(x), names)
    ax1.set_ylabel("TTFT (s)")
    ax1.legend()
    ax2.bar(list(x), [r.usd_per_mtok for r in results])
    ax2.set_xticks(list(x), names)
    ax2.set_ylabel("$/Mtok output")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(config: PrefixBenchConfig, out: Path, *, command: str, load: str) -> Path:
    """Run every arm and write ``out/prefix.md`` and ``out/prefix.png``; returns the Markdown's path."""
    results = [run_arm(config, arm)[0] for arm in ARMS]
    swept = [(n, run_arm(replace(config, sessions=n), arm)[0]) for n in config.sweep for arm in ARMS]
    out.mkdir(parents=True, exist_ok=True)
    path = out / "prefix.md"
    path.write_text(report(config, results, command=command, load=load, swept=swept))
    plot(results, out / "prefix.png")
    return path
