"""The published calibration figures (DESIGN §1) and the virtual-time scenario that reproduces each one.

``fleet/profiles/calibration/seed_figures.yaml`` (a copy of ``../shared/calibration/seed_figures.yaml``)
holds the published values; this module says how each is measured in the simulator:

- ``single_stream_math``: one closed-loop stream of maths requests (200-token problem, 4096-token reasoning
  trace), k = 0 and k = 8. "tok/s per user" is the decode rate a user sees: output tokens after the first
  divided by the time from first to last token, summed over the finished requests (1 / TPOT, token-weighted).
- ``concurrency_sweep``: N closed-loop streams (think time 0) of ``GENERAL_MIX`` at k = 8; aggregate output
  throughput = output tokens emitted in the measurement window / window length, after a warm-up.
- ``long_context_iteration``: one 378 000-token prompt of the ``long-context`` class at k = 8, 2048 output
  tokens; output tokens per decoding iteration (bonus included) = vLLM's mean acceptance length
  ``1 + accepted / drafts`` over the whole decode. The model card says "up to 5.31": the best prompt of the
  benchmark, i.e. its longest, where context lifts acceptance most. We compare the mean at the end of the
  decode, which is what vLLM's counters report per run; the maximum of a running mean would mostly measure
  the noise of its first few steps (it depends on the seed, not on the model).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from fleet.clock import ManualClock
from fleet.config import load_yaml, parse_model
from fleet.perf import Profile
from workers.sim.arrivals import Lengths, RequestKind, RequestSpec, TraceLoad, WorkloadMix, closed_loop
from workers.sim.virtual import VirtualLab, make_worker

TOLERANCE = 0.10
"""Allowed relative error of every simulated figure (±10 %)."""

GENERAL_MIX = WorkloadMix(
    (
        RequestKind("chat", Lengths(1500, 0.6, min=64, max=16_000), Lengths(500, 0.6, min=32, max=4096), 0.75),
        RequestKind("code", Lengths(2000, 0.6, min=64, max=16_000), Lengths(800, 0.6, min=32, max=4096), 0.15),
        RequestKind("maths", Lengths(300, 0.5, min=32, max=4000), Lengths(1200, 0.6, min=64, max=8192), 0.10),
    )
)
"""The "general reasoning/chat mix" of the concurrency sweep (the source does not name its workload):
75 % chat turns (1 500-token prompt with history, 500-token answer), 15 % coding (2 000 in, 800 out),
10 % maths reasoning (300 in, 1 200 out); lengths lognormal (σ 0.6), means as given."""

SINGLE_STREAM_MIX = WorkloadMix.single("maths", Lengths(200), Lengths(4096))
LONG_CONTEXT_PROMPT_TOKENS = 378_000
LONG_CONTEXT_OUTPUT_TOKENS = 2048
SWEEP_WARMUP_S = 30.0
SWEEP_WINDOW_S = 600.0
SINGLE_STREAM_S = 80.0


# ------------------------------------------------------------------------------------- the YAML file
class _Figure(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    workload: str


class SingleStreamFigure(_Figure):
    id: Literal["single_stream_math"]
    concurrency: Literal[1]
    no_speculation_tok_s_per_user: Annotated[float, Field(gt=0)]
    dspark_k8_tok_s_per_user: Annotated[float, Field(gt=0)]


class ConcurrencySweepFigure(_Figure):
    id: Literal["concurrency_sweep"]
    with_: str = Field(alias="with")
    aggregate_output_tok_s: dict[int, Annotated[float, Field(gt=0)]]


class LongContextFigure(_Figure):
    id: Literal["long_context_iteration"]
    concurrency: Literal[1]
    output_tokens_per_decoding_iteration: Annotated[float, Field(gt=1)]


class SeedFigures(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    model: dict[str, object]
    drafter: dict[str, object]
    deployment: dict[str, object]
    figures: tuple[
        Annotated[SingleStreamFigure | ConcurrencySweepFigure | LongContextFigure, Field(discriminator="id")], ...
    ]


def seed_figures_path() -> Path:
    """The packaged copy of the published figures."""
    return Path(str(resources.files("fleet.profiles.calibration").joinpath("seed_figures.yaml")))


def load_seed_figures(path: Path | None = None) -> SeedFigures:
    path = path or seed_figures_path()
    return parse_model(SeedFigures, load_yaml(path), source=str(path))


# -------------------------------------------------------------------------------------- the scenarios
def single_stream_tok_s(profile: Profile, *, k: int, seed: int = 1) -> float:
    """Decode rate of one maths stream at draft length k, tokens/s per user."""
    clock = ManualClock()
    lab = VirtualLab(
        [make_worker(profile, "w0", clock, k=k, seed=seed)], closed_loop(1, SINGLE_STREAM_MIX), clock=clock
    )
    done = lab.run(SINGLE_STREAM_S).finished()
    if not done:
        raise RuntimeError(f"single stream at k={k}: no request finished in {SINGLE_STREAM_S} s")
    return sum(r.output_tokens - 1 for r in done) / sum(r.finish_s - r.first_token_s for r in done)


def aggregate_tok_s(profile: Profile, *, concurrency: int, k: int = 8, seed: int = 1) -> float:
    """Aggregate output throughput of ``concurrency`` closed-loop streams of the general mix, tokens/s."""
    clock = ManualClock()
    worker = make_worker(profile, "w0", clock, k=k, seed=seed)
    lab = VirtualLab([worker], closed_loop(concurrency, GENERAL_MIX), clock=clock, seed=seed)
    end_s = SWEEP_WARMUP_S + SWEEP_WINDOW_S
    return lab.run(end_s).throughput(SWEEP_WARMUP_S, end_s)


def long_context_tokens_per_iteration(profile: Profile, *, k: int = 8, seed: int = 1) -> float:
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

    @property
    def error(self) -> float:
        """Relative error of the simulated value, (simulated − published) / published."""
        return (self.simulated - self.published) / self.published

    @property
    def passed(self) -> bool:
        return abs(self.error) <= TOLERANCE


def simulate_figures(profile: Profile, figures: SeedFigures | None = None, *, seed: int = 1) -> list[FigureResult]:
    """Run every figure's scenario in virtual time and pair it with its published value."""
    figures = figures or load_seed_figures()
    out: list[FigureResult] = []
    for fig in figures.figures:
        if isinstance(fig, SingleStreamFigure):
            for k, published in ((0, fig.no_speculation_tok_s_per_user), (8, fig.dspark_k8_tok_s_per_user)):
                sim = single_stream_tok_s(profile, k=k, seed=seed)
                out.append(FigureResult(f"{fig.id}: k={k}, {fig.workload}", published, sim, "tok/s per user"))
        elif isinstance(fig, ConcurrencySweepFigure):
            for n, published in sorted(fig.aggregate_output_tok_s.items()):
                sim = aggregate_tok_s(profile, concurrency=n, seed=seed)
                out.append(FigureResult(f"{fig.id}: concurrency {n}, k=8", published, sim, "tok/s aggregate"))
        else:
            sim = long_context_tokens_per_iteration(profile, seed=seed)
            published = fig.output_tokens_per_decoding_iteration
            out.append(FigureResult(f"{fig.id}: 378k prompt, k=8", published, sim, "tokens/iteration"))
    return out
