"""Calibration figures files: the published figures a profile must reproduce, with the workload of each.

Two formats, both under ``fleet/profiles/calibration/``; a profile names its file (``Profile.figures``):

- ``seed_figures.yaml`` (a byte-for-byte copy of ``../shared/calibration/seed_figures.yaml``): the Kimi K3
  launch figures (DESIGN §1) of the default profile. Its own shape; how each figure is measured is decided in
  ``workers.sim.figures``.
- ``format: benchmarks``: serving benchmarks that state their workload (dataset, lengths, ``--ignore-eos``,
  fixed k, ``max_num_seqs``), acceptance lengths that state their acceptance class, engine step times at a
  batch and a routing (``step_time``), the best k by concurrency (``best_k``), and the launch figures of
  ``seed_figures.yaml`` by reference (``launch``). A point marked ``asserted: false`` is reported beside the
  simulated value and never passes or fails.

**Fitted or predicted.** Every figure says what it is to its profile (``role``): ``fitted`` (a profile value was
solved so that the simulator reproduces it: its check confirms the fit, it cannot test the model), ``predicted``
(no value was fitted to it: its check tests the model and can fail) or ``reported`` (shown, not asserted).

Units: tokens/s, tokens, relative tolerances (0.10 = ±10 %).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from fleet.config import load_yaml, parse_model
from fleet.perf import Profile


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


Role = Literal["fitted", "predicted", "reported"]
"""What a figure is to its profile (see the module docstring)."""


# ------------------------------------------------------------------------------- seed_figures.yaml
class _SeedFigure(_Model):
    workload: str


class SingleStreamFigure(_SeedFigure):
    id: Literal["single_stream_math"]
    concurrency: Literal[1]
    no_speculation_tok_s_per_user: Annotated[float, Field(gt=0)]
    dspark_k8_tok_s_per_user: Annotated[float, Field(gt=0)]


class ConcurrencySweepFigure(_SeedFigure):
    id: Literal["concurrency_sweep"]
    with_: str = Field(alias="with")
    aggregate_output_tok_s: dict[int, Annotated[float, Field(gt=0)]]


class LongContextFigure(_SeedFigure):
    id: Literal["long_context_iteration"]
    concurrency: Literal[1]
    output_tokens_per_decoding_iteration: Annotated[float, Field(gt=1)]


class SeedFigures(_Model):
    model: dict[str, object]
    drafter: dict[str, object]
    deployment: dict[str, object]
    figures: tuple[
        Annotated[SingleStreamFigure | ConcurrencySweepFigure | LongContextFigure, Field(discriminator="id")], ...
    ]


# ------------------------------------------------------------------------------ format: benchmarks
class RandomWorkload(_Model):
    """``vllm bench serve --dataset-name random``: random token ids, fixed lengths, run to the length."""

    dataset: Literal["random"]
    input_tokens: Annotated[int, Field(gt=0)]
    output_tokens: Annotated[int, Field(gt=0)]
    ignore_eos: Literal[True]
    """Every request generates exactly ``output_tokens`` (the simulator never stops early)."""
    acceptance_class: str
    """The profile's acceptance class the simulator draws these requests' drafts from."""


class SweepRoles(_Model):
    no_speculation: Role
    dspark: Role
    ratio: Role


class SweepPoint(_Model):
    concurrency: Annotated[int, Field(ge=1)]
    no_speculation_tok_s: Annotated[float, Field(gt=0)]
    """Aggregate output throughput of the server started without speculation, tokens/s."""
    dspark_tok_s: Annotated[float, Field(gt=0)]
    """Aggregate output throughput with DSpark at the figure's fixed k, tokens/s."""
    asserted: bool = True
    """False: reported next to the simulated value, never pass or fail (say why in ``note``)."""
    note: str = ""
    roles: SweepRoles
    """Of the point's three figures: no speculation, DSpark, and their ratio."""


class ServingSweepFigure(_Model):
    """A concurrency sweep of one benchmark, with and without speculation. Asserted per point: the ratio
    DSpark / no speculation within ``ratio_tolerance`` and the DSpark throughput within ``dspark_tolerance``;
    the no-speculation throughput is reported."""

    id: Literal["serving_sweep"]
    source: str
    workload: RandomWorkload
    k: Annotated[int, Field(ge=1)]
    """Fixed draft length (vLLM ``num_speculative_tokens``)."""
    max_num_seqs: Annotated[int, Field(ge=1)]
    """vLLM ``--max-num-seqs`` of the benchmarked server (the recipe's)."""
    ratio_tolerance: Annotated[float, Field(gt=0)]
    dspark_tolerance: Annotated[float, Field(gt=0)]
    points: Annotated[tuple[SweepPoint, ...], Field(min_length=1)]


class AcceptancePoint(_Model):
    k: Annotated[int, Field(ge=1)]
    acceptance_length: Annotated[float, Field(gt=1)]
    """vLLM's mean acceptance length at this k: 1 + accepted / drafts (the bonus token included)."""
    role: Role


class AcceptanceLengthFigure(_Model):
    """Mean acceptance lengths at fixed k, for one acceptance class, each within ``tolerance``."""

    id: Literal["acceptance_length"]
    source: str
    acceptance_class: str
    """The profile's class these lengths are checked on (the text their source measured)."""
    tolerance: Annotated[float, Field(gt=0)]
    points: Annotated[tuple[AcceptancePoint, ...], Field(min_length=1)]


class StepTimePoint(_Model):
    batch: Annotated[int, Field(ge=1)]
    """Sequences decoding in the step (one token each: no speculation)."""
    routing: Literal["collapsed", "uniform"]
    """``collapsed``: every token routed to the same experts (dummy weights: a step reads ``experts_per_token``
    experts whatever the batch); ``uniform``: tokens route independently (the profile's expert model)."""
    step_ms: Annotated[float, Field(gt=0)]
    """Decode step time, milliseconds."""
    role: Role


class StepTimeFigure(_Model):
    """Decode step times of a server without speculation at fixed batches, each within ``tolerance``."""

    id: Literal["step_time"]
    source: str
    context_tokens: Annotated[int, Field(ge=1)]
    """Context of each decoding sequence, tokens (the source's, or a stated assumption)."""
    tolerance: Annotated[float, Field(gt=0)]
    points: Annotated[tuple[StepTimePoint, ...], Field(min_length=1)]


class BestKPoint(_Model):
    concurrency: Annotated[int, Field(ge=1)]
    k: Annotated[int, Field(ge=0)]
    """The k the source runs at this concurrency (0: no speculation)."""


class BestKFigure(_Model):
    """The k that gives the most aggregate output throughput at each concurrency, as the source picks it;
    compared with the simulator's best among ``candidates`` (reported: a k matches or it does not)."""

    id: Literal["best_k"]
    source: str
    workload: RandomWorkload
    candidates: Annotated[tuple[Annotated[int, Field(ge=0)], ...], Field(min_length=2)]
    """The k the source chose among (0: a server started without speculation)."""
    points: Annotated[tuple[BestKPoint, ...], Field(min_length=1)]


class LaunchReference(_Model):
    """The launch figures of ``file`` (the ``seed_figures.yaml`` format), with each one's role to this profile;
    keys as ``workers.sim.figures.launch_key`` names them."""

    id: Literal["launch"]
    file: str
    roles: dict[str, Role]


BenchmarkFigure = Annotated[
    ServingSweepFigure | AcceptanceLengthFigure | StepTimeFigure | BestKFigure | LaunchReference,
    Field(discriminator="id"),
]


class BenchmarkFigures(_Model):
    format: Literal["benchmarks"]
    deployment: dict[str, object]
    """What was measured on: hardware, parallelism, precision, engine and image (free form, for the reader)."""
    figures: tuple[BenchmarkFigure, ...]


FiguresFile = SeedFigures | BenchmarkFigures


# -------------------------------------------------------------------------------------------- loading
def calibration_path(name: str) -> Path:
    """A file of the packaged calibration directory (``fleet/profiles/calibration/<name>``)."""
    return Path(str(resources.files("fleet.profiles.calibration").joinpath(name)))


def seed_figures_path() -> Path:
    """The packaged copy of the published launch figures."""
    return calibration_path("seed_figures.yaml")


def load_seed_figures(path: Path | None = None) -> SeedFigures:
    path = path or seed_figures_path()
    return parse_model(SeedFigures, load_yaml(path), source=str(path))


def load_figures_file(path: Path) -> FiguresFile:
    """Either format, told apart by the ``format`` key."""
    raw = load_yaml(path)
    if isinstance(raw, dict) and "format" in raw:
        return parse_model(BenchmarkFigures, raw, source=str(path))
    return parse_model(SeedFigures, raw, source=str(path))


def figures_path(profile: Profile) -> Path:
    """The figures file the profile names: a packaged calibration file, or a path."""
    if profile.figures is None:
        raise ValueError(f"profile {profile.name!r} names no figures file")
    path = Path(profile.figures)
    return path if path.is_absolute() or len(path.parts) > 1 else calibration_path(profile.figures)
