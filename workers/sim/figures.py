"""The published figures a profile is calibrated to, and the virtual-time scenario that reproduces each one.

A profile names its figures file (``Profile.figures``; formats in ``workers.sim.figure_files``). How each
figure is measured in the simulator:

- ``single_stream_math`` (launch figures): one closed-loop stream of maths requests (200-token problem,
  4096-token reasoning trace) at k = 0 and at the deployment's full draft length (the launch's "k=8": DSpark's
  8-wide verification block, i.e. vLLM ``num_speculative_tokens`` = the profile's ``k_max``). "tok/s per
  user" is the decode rate a user sees: output tokens after the first over the time from first to last
  token, summed over the finished requests (1 / TPOT, token-weighted).
- ``concurrency_sweep`` (launch figures): N closed-loop streams (think time 0) of ``vllm bench serve``'s
  random dataset at its default lengths (1024 in, 128 out, run to the length) at k_max; aggregate output
  throughput = output tokens emitted in the measurement window / window length, after a warm-up. The source
  does not name its dataset and ``seed_figures.yaml`` suggests a chat mix; we read it as ``vllm bench``'s
  random dataset (the reason is in the default profile's header).
- ``long_context_iteration`` (launch figures): one 378 000-token prompt of the ``long-context`` class at
  k_max, 2048 output tokens; output tokens per decoding iteration (bonus included) = vLLM's mean acceptance
  length ``1 + accepted / drafts`` over the whole decode. The model card says "up to 5.31": the best prompt of
  the benchmark, i.e. its longest, where context lifts acceptance most. We compare the mean at the end of the
  decode, which is what vLLM's counters report per run.
- ``serving_sweep`` (benchmarks): the figure's workload as N closed-loop streams at k = 0 and at its fixed k,
  ``max_num_seqs`` as the figure states; throughput measured as for ``concurrency_sweep``.

Every k = 0 ("no speculation") figure runs on a worker started without a drafter, as its source measured it, so
it pays no idle-drafter tax (``fleet.perf.IdleDrafterTax``); every other figure runs with the drafter loaded.
- ``acceptance_length`` (benchmarks): one closed-loop stream of the figure's class (1024-token prompts,
  1024-token answers) at each fixed k; vLLM's mean acceptance length over the run.
- ``step_time`` (benchmarks): ``batch`` closed-loop streams on a server without speculation; the mean duration of
  its pure decode steps at that batch. Collapsed routing (dummy weights) runs the profile with every token on the
  same ``experts_per_token`` experts (``collapsed_routing``).
- ``best_k`` (benchmarks): at each concurrency, the aggregate throughput (as ``serving_sweep``, over
  ``BEST_K_WINDOW_S``) at every candidate k; the simulator's best k is reported beside the source's, with the
  throughput the source's k gives as a share of the best's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from fleet.clock import ManualClock
from fleet.perf import Profile
from workers.sim.arrivals import Lengths, RequestKind, RequestSpec, TraceLoad, WorkloadMix, closed_loop
from workers.sim.figure_files import (
    AcceptanceLengthFigure,
    BenchmarkFigures,
    BestKFigure,
    ConcurrencySweepFigure,
    FiguresFile,
    Role,
    SeedFigures,
    ServingSweepFigure,
    SingleStreamFigure,
    StepTimeFigure,
    calibration_path,
    figures_path,
    load_figures_file,
    load_seed_figures,
)
from workers.sim.virtual import VirtualLab, make_worker

TOLERANCE = 0.10
"""Allowed relative error of every launch figure (±10 %)."""

GENERAL_MIX = WorkloadMix(
    (
        RequestKind("chat", Lengths(1500, 0.6, min=64, max=16_000), Lengths(500, 0.6, min=32, max=4096), 0.75),
        RequestKind("code", Lengths(2000, 0.6, min=64, max=16_000), Lengths(800, 0.6, min=32, max=4096), 0.15),
        RequestKind("maths", Lengths(300, 0.5, min=32, max=4000), Lengths(1200, 0.6, min=64, max=8192), 0.10),
    )
)
"""A general reasoning/chat mix (the crossover tables' and the lab speed benchmark's default traffic):
75 % chat turns (1 500-token prompt with history, 500-token answer), 15 % coding (2 000 in, 800 out),
10 % maths reasoning (300 in, 1 200 out); lengths lognormal (σ 0.6), means as given."""

LAUNCH_SWEEP_MIX = WorkloadMix.single("random", Lengths(1024), Lengths(128))
"""``vllm bench serve --dataset-name random`` at its default lengths, run to the length."""
SINGLE_STREAM_MIX = WorkloadMix.single("maths", Lengths(200), Lengths(4096))
ACCEPTANCE_PROMPT_TOKENS = 1024
ACCEPTANCE_OUTPUT_TOKENS = 1024
LONG_CONTEXT_PROMPT_TOKENS = 378_000
LONG_CONTEXT_OUTPUT_TOKENS = 2048
SWEEP_WARMUP_S = 30.0
SWEEP_WINDOW_S = 600.0
SINGLE_STREAM_S = 80.0
STEP_TIME_OUTPUT_TOKENS = 64
BEST_K_WINDOW_S = 180.0
"""Measured window of each best-k run: a few hundred 1 024-token answers at 4 streams (shorter than the sweeps')."""
STEP_TIME_RUN_S = 20.0


# -------------------------------------------------------------------------------------- the scenarios
def single_stream_tok_s(profile: Profile, *, k: int, seed: int = 1) -> float:
    """Decode rate of one maths stream at draft length k, tokens/s per user (k = 0: without a drafter)."""
    clock = ManualClock()
    worker = make_worker(profile, "w0", clock, k=k, seed=seed, drafter_loaded=k > 0)
    lab = VirtualLab([worker], closed_loop(1, SINGLE_STREAM_MIX), clock=clock)
    done = lab.run(SINGLE_STREAM_S).finished()
    if not done:
        raise RuntimeError(f"single stream at k={k}: no request finished in {SINGLE_STREAM_S} s")
    return sum(r.output_tokens - 1 for r in done) / sum(r.finish_s - r.first_token_s for r in done)


def aggregate_tok_s(
    profile: Profile,
    *,
    concurrency: int,
    k: int,
    mix: WorkloadMix = LAUNCH_SWEEP_MIX,
    max_num_seqs: int | None = None,
    seed: int = 1,
    window_s: float = SWEEP_WINDOW_S,
) -> float:
    """Aggregate output throughput of ``concurrency`` closed-loop streams of ``mix`` at draft length ``k``,
    tokens/s, over ``window_s`` after a warm-up; ``max_num_seqs`` defaults to the profile's. k = 0 runs without a
    drafter (no speculative config)."""
    clock = ManualClock()
    seqs = max_num_seqs or profile.serving.max_num_seqs
    worker = make_worker(profile, "w0", clock, k=k, max_num_seqs=seqs, seed=seed, drafter_loaded=k > 0)
    lab = VirtualLab([worker], closed_loop(concurrency, mix), clock=clock, seed=seed)
    end_s = SWEEP_WARMUP_S + window_s
    return lab.run(end_s).throughput(SWEEP_WARMUP_S, end_s)


def acceptance_length(profile: Profile, workload: str, *, k: int, seed: int = 1) -> float:
    """vLLM's mean acceptance length (1 + accepted / drafts) of one stream of ``workload`` at draft length k."""
    clock = ManualClock()
    worker = make_worker(profile, "w0", clock, k=k, seed=seed)
    mix = WorkloadMix.single(workload, Lengths(ACCEPTANCE_PROMPT_TOKENS), Lengths(ACCEPTANCE_OUTPUT_TOKENS))
    VirtualLab([worker], closed_loop(1, mix), clock=clock, seed=seed).run(SINGLE_STREAM_S)
    return worker.stats.mean_accepted_length


def long_context_tokens_per_iteration(profile: Profile, *, k: int, seed: int = 1) -> float:
    """Mean output tokens per decoding iteration (1 + accepted/drafts) for one 378 000-token prompt."""
    clock = ManualClock()
    worker = make_worker(profile, "w0", clock, k=k, seed=seed)
    spec = RequestSpec("long-context", LONG_CONTEXT_PROMPT_TOKENS, LONG_CONTEXT_OUTPUT_TOKENS)
    lab = VirtualLab([worker], TraceLoad([(0.0, spec)]), clock=clock, seed=seed)
    while worker.engine.has_work() or not lab.records.requests:
        lab.run(lab.now_s + 60.0)
    return worker.stats.mean_accepted_length


# -------------------------------------------------------------------------------------- the comparison
@dataclass(frozen=True)
class FigureResult:
    figure: str
    """``<figure id>: <what>`` as shown in the table."""
    published: float
    simulated: float
    unit: str
    tolerance: float | None
    """Allowed relative error; None: reported, not asserted."""
    role: Role = "reported"
    """Fitted, predicted or reported (``workers.sim.figure_files``)."""

    @property
    def error(self) -> float:
        """Relative error of the simulated value, (simulated − published) / published (0 when both are 0)."""
        if self.published == 0:
            return 0.0 if self.simulated == 0 else math.inf
        return (self.simulated - self.published) / self.published

    @property
    def asserted(self) -> bool:
        return self.tolerance is not None

    @property
    def passed(self) -> bool | None:
        """Within tolerance; None for a reported figure."""
        return None if self.tolerance is None else abs(self.error) <= self.tolerance


def load_profile_figures(profile: Profile) -> FiguresFile:
    """The figures file the profile names."""
    return load_figures_file(figures_path(profile))


def simulate_figures(profile: Profile, figures: FiguresFile | None = None, *, seed: int = 1) -> list[FigureResult]:
    """Run every figure's scenario in virtual time and pair it with its published value (default: the
    profile's own figures file)."""
    figures = figures or load_profile_figures(profile)
    if isinstance(figures, SeedFigures):
        return list(_launch_results(profile, figures, seed, {}))
    return list(_benchmark_results(profile, figures, seed))


def launch_key(fig_id: str, what: str) -> str:
    """A launch figure's key in a ``launch`` reference's roles: ``single_stream_math k=0``,
    ``single_stream_math k=k_max``, ``concurrency_sweep 16``, ``long_context_iteration``."""
    return f"{fig_id} {what}".strip()


def _launch_results(
    profile: Profile, figures: SeedFigures, seed: int, roles: Mapping[str, Role]
) -> Iterator[FigureResult]:
    k_max = profile.drafter.k_max

    def role(key: str) -> Role:
        if roles and key not in roles:
            raise ValueError(f"launch roles: no role for {key!r} (known: {sorted(roles)})")
        return roles.get(key, "fitted")

    for fig in figures.figures:
        if isinstance(fig, SingleStreamFigure):
            for k, published, what in (
                (0, fig.no_speculation_tok_s_per_user, "k=0"),
                (k_max, fig.dspark_k8_tok_s_per_user, "k=k_max"),
            ):
                sim = single_stream_tok_s(profile, k=k, seed=seed)
                name = f"{fig.id}: k={k}, {fig.workload}"
                yield FigureResult(name, published, sim, "tok/s per user", TOLERANCE, role(launch_key(fig.id, what)))
        elif isinstance(fig, ConcurrencySweepFigure):
            for n, published in sorted(fig.aggregate_output_tok_s.items()):
                sim = aggregate_tok_s(profile, concurrency=n, k=k_max, seed=seed)
                name = f"{fig.id}: concurrency {n}, k={k_max}, random 1024/128"
                yield FigureResult(name, published, sim, "tok/s aggregate", TOLERANCE, role(launch_key(fig.id, str(n))))
        else:
            sim = long_context_tokens_per_iteration(profile, k=k_max, seed=seed)
            published = fig.output_tokens_per_decoding_iteration
            name = f"{fig.id}: 378k prompt, k={k_max}"
            yield FigureResult(name, published, sim, "tokens/iteration", TOLERANCE, role(launch_key(fig.id, "")))


def _benchmark_results(profile: Profile, figures: BenchmarkFigures, seed: int) -> Iterator[FigureResult]:
    for fig in figures.figures:
        if isinstance(fig, ServingSweepFigure):
            yield from _sweep_results(profile, fig, seed)
        elif isinstance(fig, AcceptanceLengthFigure):
            yield from _acceptance_results(profile, fig, seed)
        elif isinstance(fig, StepTimeFigure):
            yield from _step_time_results(profile, fig, seed)
        elif isinstance(fig, BestKFigure):
            yield from _best_k_results(profile, fig, seed)
        else:
            yield from _launch_results(profile, load_seed_figures(calibration_path(fig.file)), seed, fig.roles)


def _sweep_results(profile: Profile, fig: ServingSweepFigure, seed: int) -> Iterator[FigureResult]:
    w = fig.workload
    mix = WorkloadMix.single(w.acceptance_class, Lengths(w.input_tokens), Lengths(w.output_tokens))
    what = f"{w.dataset} {w.input_tokens}/{w.output_tokens}"
    for p in fig.points:
        base = aggregate_tok_s(
            profile, concurrency=p.concurrency, k=0, mix=mix, max_num_seqs=fig.max_num_seqs, seed=seed
        )
        spec = aggregate_tok_s(
            profile, concurrency=p.concurrency, k=fig.k, mix=mix, max_num_seqs=fig.max_num_seqs, seed=seed
        )
        at = f"{fig.id}: concurrency {p.concurrency}, {what}"
        ratio_tol, dspark_tol = (fig.ratio_tolerance, fig.dspark_tolerance) if p.asserted else (None, None)
        r = p.roles
        yield FigureResult(f"{at}, k=0", p.no_speculation_tok_s, base, "tok/s aggregate", None, r.no_speculation)
        yield FigureResult(f"{at}, k={fig.k}", p.dspark_tok_s, spec, "tok/s aggregate", dspark_tol, r.dspark)
        published_ratio = p.dspark_tok_s / p.no_speculation_tok_s
        yield FigureResult(f"{at}, k={fig.k} / k=0", published_ratio, spec / base, "ratio", ratio_tol, r.ratio)


def _acceptance_results(profile: Profile, fig: AcceptanceLengthFigure, seed: int) -> Iterator[FigureResult]:
    for p in fig.points:
        sim = acceptance_length(profile, fig.acceptance_class, k=p.k, seed=seed)
        name = f"{fig.id}: k={p.k}, {fig.acceptance_class}"
        yield FigureResult(name, p.acceptance_length, sim, "tokens/step", fig.tolerance, p.role)


def collapsed_routing(profile: Profile) -> Profile:
    """``profile`` with every token routed to the same ``experts_per_token`` experts (dummy weights): a step reads
    that many experts whatever its batch."""
    target = profile.target.model_copy(update={"num_experts": profile.target.experts_per_token})
    return profile.model_copy(update={"target": target})


def decode_step_s(profile: Profile, *, batch: int, context_tokens: int, seed: int = 1) -> float:
    """Mean time of the pure decode steps at ``batch`` sequences of a server started without speculation, seconds:
    ``batch`` closed-loop streams whose prompts are ``context_tokens`` long, each answering 64 tokens."""
    clock = ManualClock()
    worker = make_worker(profile, "w0", clock, k=0, max_num_seqs=batch, seed=seed, drafter_loaded=False)
    mix = WorkloadMix.single(profile.default_workload, Lengths(context_tokens), Lengths(STEP_TIME_OUTPUT_TOKENS))
    lab = VirtualLab([worker], closed_loop(batch, mix), clock=clock, seed=seed)
    steps = lab.run(STEP_TIME_RUN_S).steps
    full = [s.duration_s for s in steps if s.prefill_tokens == 0 and s.decode_seqs == batch]
    if not full:
        raise RuntimeError(f"no pure decode step at batch {batch} in {STEP_TIME_RUN_S} s")
    return sum(full) / len(full)


def _step_time_results(profile: Profile, fig: StepTimeFigure, seed: int) -> Iterator[FigureResult]:
    for p in fig.points:
        prof = collapsed_routing(profile) if p.routing == "collapsed" else profile
        sim = decode_step_s(prof, batch=p.batch, context_tokens=fig.context_tokens, seed=seed) * 1e3
        name = f"{fig.id}: batch {p.batch}, {p.routing} routing, k=0"
        yield FigureResult(name, p.step_ms, sim, "ms per step", fig.tolerance, p.role)


def best_k(profile: Profile, fig: BestKFigure, concurrency: int, seed: int = 1) -> tuple[int, dict[int, float]]:
    """The candidate k with the most aggregate output throughput at ``concurrency`` streams of the figure's
    workload, and every candidate's throughput (tokens/s; k = 0 without a drafter)."""
    w = fig.workload
    mix = WorkloadMix.single(w.acceptance_class, Lengths(w.input_tokens), Lengths(w.output_tokens))
    seqs = max(concurrency, profile.serving.max_num_seqs)
    rates = {
        k: aggregate_tok_s(
            profile, concurrency=concurrency, k=k, mix=mix, max_num_seqs=seqs, seed=seed, window_s=BEST_K_WINDOW_S
        )
        for k in fig.candidates
    }
    return max(rates, key=lambda k: (rates[k], -k)), rates


def _best_k_results(profile: Profile, fig: BestKFigure, seed: int) -> Iterator[FigureResult]:
    w = fig.workload
    for p in fig.points:
        k, rates = best_k(profile, fig, p.concurrency, seed)
        at = f"{fig.id}: concurrency {p.concurrency}, {w.acceptance_class} {w.input_tokens}/{w.output_tokens}"
        yield FigureResult(f"{at}, best k", p.k, k, "k", None, "predicted")
        yield FigureResult(
            f"{at}, tok/s at the source's k / at the best k", 1.0, rates[p.k] / rates[k], "ratio", None, "predicted"
        )
