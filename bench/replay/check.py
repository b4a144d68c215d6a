"""The replay's prediction checked against reality (issue 17), on the embedded stack in this process:

1. start the embedded deployment (its simulated workers on free loopback ports, the gateway, the controller)
   and drive real HTTP traffic through the gateway: two tenants (interactive ``demo``, batch ``batch-demo``),
   open-loop Poisson arrivals plus closed-loop sessions (``x-gearshift-session``: a turn waits for the previous
   answer, then thinks); once with the controller on and once at a static k (the recipe default, no controller);
2. export the gateway's ledger of each run;
3. fit a profile to one simulated worker with ``gearshift profile``'s sweep (``bench.profiler``);
4. replay each run's ledger with that profile under the policy that actually ran;
5. compare the replay's prediction with the gateway's own measurements of the run, per tier: throughput
   (output tokens of requests finished inside the window, per second), TTFT and TPOT p50/p99. Target: within
   ``TOLERANCE``; a figure outside it is a miss only if it is outside it for every value of the measured figure's
   confidence interval (``bench.replay.confidence``: from its number of samples).

Both sides use the same definitions: the gateway measures TTFT from a request's arrival at the gateway to its
first streamed chunk and TPOT from the first to the last chunk over the tokens after the first; the lab the same
in virtual time. The gateway's own overhead (~1 ms) and the event loop's delays on a loaded machine are real
effects the lab does not model; they show up in the comparison.
"""

from __future__ import annotations

import asyncio
import math
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from bench.policy.policies import ControllerPolicy, LabPolicy, StaticSchedule
from bench.procs import free_port
from bench.profiler.run import profile_worker
from bench.profiler.sweep import SweepConfig
from bench.replay.confidence import Interval, Verdict, error_interval, quantile_interval, rate_interval, verdict
from bench.replay.run import PolicyRun, run_one
from bench.replay.scenario import plan_replay
from bench.replay.trace import TraceRequest, rebase
from controller.app import ControllerComponent, controller_settings_from
from fleet.bearer import bearer_header
from fleet.clock import SystemClock
from fleet.config import CommonSettings, load_fleet, load_tenants
from fleet.perf import Profile, load_profile
from fleet.speculation import SpeculationUpdate
from fleet.speculation_client import SpeculationClient
from fleet.stats import percentile
from fleet.store.memory import MemoryStore
from fleet.store.protocol import UsageRecord
from gateway.http.serve import GatewayServer
from gateway.settings import GatewaySettings
from gateway.wiring import GatewayDeps
from workers.sim.fleet import SimFleet, fleet_worker_settings

TOLERANCE = 0.15
KEYS = {"interactive": "gs-demo-key", "batch": "gs-batch-key"}
"""The embedded tenants' demo keys (``fleet/defaults/tenants.yaml``) by tier."""
SESSION_HEADER = "x-gearshift-session"
METRICS = ("throughput_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")


@dataclass(frozen=True)
class CheckConfig:
    duration_s: float = 60.0
    """Seconds of real traffic per run."""
    rate_per_s: float = 2.0
    """Open-loop arrivals per second, each tier."""
    sessions: int = 4
    """Closed-loop sessions (interactive tier), each sending turns for the whole run."""
    think_s: float = 1.0
    prompt_words: tuple[int, int] = (50, 400)
    max_tokens: tuple[int, int] = (16, 160)
    speedup: float = 1.0
    """Simulated seconds per real second of the embedded workers."""
    static_k: int = 7
    seed: int = 3


@dataclass
class TierFigures:
    throughput_tok_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    requests: int
    intervals: dict[str, Interval] = field(default_factory=dict)
    """Measured figures only: each metric's confidence interval from its samples (``bench.replay.confidence``)."""
    samples: dict[str, int] = field(default_factory=dict)
    """Measured figures only: how many samples each metric was computed from."""


@dataclass(frozen=True)
class Judged:
    """One predicted figure against its measured one: the relative error, its interval over the measured figure's
    confidence interval, and the verdict (``bench.replay.confidence.verdict``)."""

    error: float
    interval: Interval
    verdict: Verdict


@dataclass
class Comparison:
    policy: str
    measured: dict[str, TierFigures]
    predicted: dict[str, TierFigures]
    records: int

    def ratio(self, tier: str, metric: str) -> float:
        want, got = getattr(self.measured[tier], metric), getattr(self.predicted[tier], metric)
        return got / want if want else float("nan")

    def within(self, tolerance: float = TOLERANCE) -> bool:
        return all(
            abs(self.ratio(t, m) - 1.0) <= tolerance for t in self.measured if t in self.predicted for m in METRICS
        )

    def judge(self, tier: str, metric: str, tolerance: float = TOLERANCE) -> Judged:
        measured = self.measured[tier].intervals.get(metric, Interval(0.0, math.inf))
        error = self.ratio(tier, metric) - 1.0
        interval = error_interval(getattr(self.predicted[tier], metric), measured)
        return Judged(error, interval, verdict(error, interval, tolerance))

    def verdicts(self, tolerance: float = TOLERANCE) -> dict[Verdict, int]:
        """How many figures are within, within their CI only, and missed."""
        out: dict[Verdict, int] = {"within": 0, "within its CI": 0, "miss": 0}
        for tier in self.measured:
            if tier in self.predicted:
                for metric in METRICS:
                    out[self.judge(tier, metric, tolerance).verdict] += 1
        return out


@dataclass
class CheckResult:
    config: CheckConfig
    comparisons: list[Comparison] = field(default_factory=list)
    profile_name: str = ""
    fit_s: float = 0.0
    wall_s: float = 0.0


def measured_figures(records: Sequence[UsageRecord], *, start: float, window_s: float) -> dict[str, TierFigures]:
    """The gateway's own figures per tier from its ledger: requests that arrived in ``[start, start + window)``."""
    out: dict[str, TierFigures] = {}
    for tier in sorted({r.tier or "" for r in records}):
        mine = [
            r for r in records if (r.tier or "") == tier and r.arrived_at is not None and start <= r.arrived_at
            and r.arrived_at < start + window_s and r.status == "ok"
        ]  # fmt: skip
        done_in_window = [r for r in mine if r.at < start + window_s]
        ttfts = [r.ttft_s for r in mine if r.ttft_s is not None]
        tpots = [r.tpot_s for r in mine if r.tpot_s is not None]
        tokens = [float(r.completion_tokens) for r in done_in_window]
        out[tier] = TierFigures(
            throughput_tok_s=sum(tokens) / window_s,
            ttft_p50_s=percentile(ttfts, 0.5),
            ttft_p99_s=percentile(ttfts, 0.99),
            tpot_p50_s=percentile(tpots, 0.5),
            tpot_p99_s=percentile(tpots, 0.99),
            requests=len(mine),
            intervals={
                "throughput_tok_s": rate_interval(tokens, window_s),
                **{f"ttft_p{round(q * 100)}_s": quantile_interval(ttfts, q) for q in (0.5, 0.99)},
                **{f"tpot_p{round(q * 100)}_s": quantile_interval(tpots, q) for q in (0.5, 0.99)},
            },
            samples={
                "throughput_tok_s": len(tokens),
                **{f"ttft_p{p}_s": len(ttfts) for p in (50, 99)},
                **{f"tpot_p{p}_s": len(tpots) for p in (50, 99)},
            },
        )
    return out


def predicted_figures(run: PolicyRun) -> dict[str, TierFigures]:
    return {
        tier: TierFigures(t.finished_tok_s, t.ttft_p50_s, t.ttft_p99_s, t.tpot_p50_s, t.tpot_p99_s, t.requests)
        for tier, t in run.tiers.items()
    }


def as_trace(records: Sequence[UsageRecord]) -> list[TraceRequest]:
    """Ledger records as trace requests at absolute times (what ``gearshift usage export`` + ``read_trace`` give)."""
    return [
        TraceRequest(
            arrival_s=r.arrived_at if r.arrived_at is not None else r.at,
            prompt_tokens=max(1, r.prompt_tokens),
            output_tokens=r.completion_tokens,
            tenant=r.tenant,
            tier=r.tier,
            workload=r.workload,
            session=r.session,
            worker_id=r.worker_id,
            finish_s=r.at,
        )
        for r in records
        if r.completion_tokens > 0 and r.status == "ok"
    ]


# ------------------------------------------------------------------------------------------ the real run
def _fleet_file(tmp: Path) -> Path:
    """The embedded default fleet with its workers on free loopback ports."""
    fleet = load_fleet(None).model_dump(mode="json", exclude_none=True)
    for worker in fleet["workers"]:
        worker["url"] = f"http://127.0.0.1:{free_port()}"
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet))
    return path


def _prompt(rng: random.Random, words: tuple[int, int]) -> str:
    vocabulary = ("alpha", "river", "stone", "light", "orbit", "cedar", "quiet", "ember", "delta", "field")
    return " ".join(rng.choice(vocabulary) for _ in range(rng.randint(*words)))


async def _send(client: httpx.AsyncClient, body: dict[str, object], headers: dict[str, str]) -> None:
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        async for _ in response.aiter_bytes():
            pass


async def drive(url: str, model: str, config: CheckConfig, *, progress: Callable[[str], None]) -> int:
    """Real traffic through the gateway for ``config.duration_s``; returns how many requests were sent."""
    rng = random.Random(config.seed)
    end = time.monotonic() + config.duration_s
    sent = 0
    tasks: set[asyncio.Task[None]] = set()
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120.0), limits=limits) as client:

        def body() -> dict[str, object]:
            return {
                "model": model,
                "messages": [{"role": "user", "content": _prompt(rng, config.prompt_words)}],
                "max_tokens": rng.randint(*config.max_tokens),
                "stream": True,
                "stream_options": {"include_usage": True},
                "ignore_eos": True,
            }

        async def open_loop(tier: str) -> None:
            nonlocal sent
            while (now := time.monotonic()) < end:
                await asyncio.sleep(min(rng.expovariate(config.rate_per_s), max(0.0, end - now)))
                if time.monotonic() >= end:
                    return
                task = asyncio.create_task(_send(client, body(), bearer_header(KEYS[tier])))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                sent += 1

        async def session(i: int) -> None:
            nonlocal sent
            headers = {**bearer_header(KEYS["interactive"]), SESSION_HEADER: f"check-{config.seed}-{i}"}
            await asyncio.sleep(rng.uniform(0.0, config.think_s))
            while time.monotonic() < end:
                sent += 1
                await _send(client, body(), headers)
                await asyncio.sleep(config.think_s)

        drivers = [open_loop("interactive"), open_loop("batch"), *(session(i) for i in range(config.sessions))]
        ticker = asyncio.create_task(_progress(end, progress))
        await asyncio.gather(*drivers)
        ticker.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=120.0)
    return sent


async def _progress(end: float, progress: Callable[[str], None]) -> None:
    while (left := end - time.monotonic()) > 0:
        progress(f"  traffic: {left:.0f} s left")
        await asyncio.sleep(min(10.0, left))


async def record_run(
    config: CheckConfig, *, controller: bool, progress: Callable[[str], None]
) -> tuple[list[UsageRecord], float, list[str]]:
    """One real run on a fresh embedded stack; returns its ledger, its start (Unix s) and the worker URLs."""
    with tempfile.TemporaryDirectory() as tmp:
        common = CommonSettings(fleet_file=_fleet_file(Path(tmp)))
        fleet = common.fleet()
        clock = SystemClock()
        store = MemoryStore(clock=clock)
        sims = SimFleet(
            fleet_worker_settings(fleet, seed=config.seed, speedup=config.speedup, control_token=common.control_token)
        )
        gateway = GatewayServer(
            GatewayDeps(
                GatewaySettings(port=free_port(), fleet_file=common.fleet_file, log_level="WARNING"),
                store=store, clock=clock, fleet=fleet, tenants=load_tenants(None),
            ),
            handle_signals=False,
        )  # fmt: skip
        parts: list[SimFleet | GatewayServer | ControllerComponent] = [sims, gateway]
        if controller:
            parts.append(ControllerComponent(controller_settings_from(common, metrics_port=0), store=store))
        started: list[SimFleet | GatewayServer | ControllerComponent] = []
        try:
            for part in parts:
                await part.start()
                started.append(part)
            urls = [w.url for w in fleet.workers]
            if not controller:
                await _set_static_k(urls, config.static_k, common.control_token.get_secret_value())
            t0 = clock.wall()
            progress(f"run with {'the controller' if controller else f'static k={config.static_k}'} …")
            sent = await drive(gateway.url, fleet.models[0].name, config, progress=progress)
            records = await store.ledger(since=0.0, until=clock.wall() + 1.0, limit=10 * sent + 100)
            return records, t0, urls
        finally:
            for part in reversed(started):
                await part.stop()


async def _set_static_k(urls: Sequence[str], k: int, token: str) -> None:
    async with httpx.AsyncClient(timeout=10.0) as client:
        speculation = SpeculationClient(client, control_token=token)
        for url in urls:
            state = await speculation.state(url)
            update = SpeculationUpdate(k=k, lease_seconds=3600.0, version=state.version + 1, reason="replay check")
            await speculation.update(url, update)


async def fit(config: CheckConfig, *, progress: Callable[[str], None]) -> Profile:
    """A profile fitted to one embedded simulated worker (``gearshift profile``'s sweep)."""
    with tempfile.TemporaryDirectory() as tmp:
        common = CommonSettings(fleet_file=_fleet_file(Path(tmp)))
        fleet = common.fleet()
        sims = SimFleet(
            fleet_worker_settings(fleet, seed=config.seed, speedup=config.speedup, control_token=common.control_token)
        )
        await sims.start()
        try:
            model = fleet.model(fleet.workers[0].model)
            assert model is not None
            sweep = SweepConfig(batch_sizes=(1, 4, 16, 32), ks=(0, 1, 3, 7), window_steps=30)
            result = await profile_worker(
                fleet.workers[0].url,
                sweep,
                base=load_profile(model.profile),
                control_token=common.control_token.get_secret_value(),
                name="check-fitted",
                workload="chat",
                progress=lambda p: progress(f"  profile point batch {p.batch_size} k {p.k}: {p.step_s * 1e3:.1f} ms"),
            )
            return result.profile
        finally:
            await sims.stop()


def predict(
    records: Sequence[UsageRecord],
    t0: float,
    profile: Profile,
    profile_path: str,
    policy: LabPolicy,
    config: CheckConfig,
) -> PolicyRun:
    """The replay of a run's ledger under ``policy`` on ``profile`` with the run's fleet."""
    fleet = load_fleet(None)
    trace = rebase([r for r in as_trace(records) if r.arrival_s >= t0], source="check")
    plan = plan_replay(
        trace,
        profile,
        profile_path=profile_path,
        workers=len(fleet.workers),
        tenants=load_tenants(None),
        phase_s=config.duration_s,
        max_num_seqs=fleet.workers[0].max_num_seqs,
        window_s=config.duration_s,
    )
    return run_one(plan, policy, profile)


def _save_ledger(records: Sequence[UsageRecord], path: Path) -> None:
    path.write_text("".join(r.model_dump_json() + "\n" for r in records))


def _save_profile(profile: Profile, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False))
    return path


async def check(config: CheckConfig, profile_dir: Path, *, progress: Callable[[str], None]) -> CheckResult:
    started = time.perf_counter()
    result = CheckResult(config)
    fit_started = time.perf_counter()
    profile = await fit(config, progress=progress)
    result.fit_s = time.perf_counter() - fit_started
    path = _save_profile(profile, profile_dir / "check-fitted.yaml")
    result.profile_name = str(path)
    runs: list[tuple[bool, LabPolicy]] = [(True, ControllerPolicy()), (False, StaticSchedule.plain(config.static_k))]
    for controller, policy in runs:
        records, t0, _ = await record_run(config, controller=controller, progress=progress)
        _save_ledger(records, profile_dir / f"ledger-{policy.name}.jsonl")
        measured = measured_figures(records, start=t0, window_s=config.duration_s)
        # the lab runs its own event loops: replay in a thread, away from this one
        run = await asyncio.to_thread(predict, records, t0, profile, str(path), policy, config)
        predicted = predicted_figures(run)
        result.comparisons.append(Comparison(policy.name, measured, predicted, len(records)))
    result.wall_s = time.perf_counter() - started
    return result
