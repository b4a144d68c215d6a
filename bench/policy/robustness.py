"""The robustness grid (issue 12): the controller believes one profile, the simulated workers run another.

For each believed profile of the family, the workers run a perturbed copy of it (or the other profile):

- acceptance ×0.7 and ×1.3: every class's conditional per-position acceptance scaled (capped at ``P_CAP``);
- step time ×0.7 and ×1.3: every time term scaled (bandwidth and compute divided, fixed times multiplied), so
  every step takes f × as long;
- the per-token (slope) term ×0.5 and ×2 with the fixed term unchanged: what grows with the tokens of a step
  (routed experts' bytes, FLOPs, KV and state bytes, communication, sampling and verification per token, the
  drafter's per-sequence and per-position cost) scaled; dense weights, the step overhead and the drafter's fixed
  pass kept;
- the other profile of the family.

A cell is two runs of the controller on the same workers and the same seeded trace: believing the base profile
(the wrong model) and believing the workers' own profile (the unperturbed run). Its loss is
``1 − goodput(wrong) / goodput(right)``: what the model error costs once the online correction (step-time
correction, acceptance estimator) and the probes have done their work. Target: every cell within 5 %.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bench.executor import Executor, LocalPool
from bench.policy import load
from bench.policy.lab import run_policy
from bench.policy.policies import ControllerPolicy
from bench.policy.run_metrics import summarise
from bench.policy.scenario import Scenario
from bench.policy.suite import family_profiles
from fleet.perf import Profile, load_profile

P_CAP = 0.98
"""Highest conditional acceptance a scaled class may reach."""
TARGET_LOSS = 0.05
"""Every cell's goodput loss must stay within this fraction of the unperturbed run."""
DEFAULT_SCENARIOS = ("phase-shift", "straddle")
"""What ``gearshift bench robustness`` runs by default: a workload shift, and a load that crosses the batch size
where speculation stops paying, so the best k varies across phases (k_max ↔ lower k ↔ off), not only the class."""

Kind = Literal["acceptance", "step", "slope", "profile"]


@dataclass(frozen=True, slots=True)
class Cell:
    """One cell of the grid: the profile the controller believes and what the workers run instead."""

    believed: str
    kind: Kind
    factor: float = 1.0
    other: str = ""
    """The profile the workers run (``kind == "profile"``)."""

    @property
    def label(self) -> str:
        names = {"acceptance": "acceptance", "step": "step time", "slope": "per-token slope"}
        return f"workers run {self.other}" if self.kind == "profile" else f"{names[self.kind]} ×{self.factor:g}"


def scale_acceptance(profile: Profile, factor: float) -> Profile:
    """Every class's conditional acceptance × ``factor`` (capped at ``P_CAP``)."""
    classes = {
        name: cls.model_copy(update={"base": tuple(min(p * factor, P_CAP) for p in cls.base)})
        for name, cls in profile.acceptance.items()
    }
    return profile.model_copy(update={"acceptance": classes, "name": f"{profile.name}~acceptance×{factor:g}"})


def scale_step_time(profile: Profile, factor: float) -> Profile:
    """Every step takes ``factor`` × as long: rates divided, times multiplied."""
    t, d, hw = profile.target, profile.drafter, profile.hardware
    times = ("comm_s_per_token", "step_overhead_s", "sample_s_per_token", "verify_s_per_token")
    target = t.model_copy(update={n: getattr(t, n) * factor for n in times})
    drafter = d.model_copy(update={n: getattr(d, n) * factor for n in ("fixed_s", "per_seq_s", "per_position_s")})
    rates = {"hbm_bytes_per_s": hw.hbm_bytes_per_s / factor, "flops_per_s": hw.flops_per_s / factor}
    if hw.moe_flops_per_s is not None:
        rates["moe_flops_per_s"] = hw.moe_flops_per_s / factor
    return profile.model_copy(
        update={
            "target": target,
            "drafter": drafter,
            "hardware": hw.model_copy(update=rates),
            "name": f"{profile.name}~step×{factor:g}",
        }
    )


def scale_slope(profile: Profile, factor: float) -> Profile:
    """What a step's cost gains per token × ``factor``; the fixed part (dense weights, overhead, the drafter's
    fixed pass) unchanged."""
    t, d = profile.target, profile.drafter
    per_token = (
        "expert_bytes",
        "active_params",
        "routed_active_params",
        "attention_flops_per_context_token",
        "kv_bytes_per_token",
        "state_bytes_per_seq",
        "comm_s_per_token",
        "sample_s_per_token",
        "verify_s_per_token",
    )
    target = t.model_copy(update={n: getattr(t, n) * factor for n in per_token})
    drafter = d.model_copy(update={n: getattr(d, n) * factor for n in ("per_seq_s", "per_position_s")})
    return profile.model_copy(update={"target": target, "drafter": drafter, "name": f"{profile.name}~slope×{factor:g}"})


_PERTURB: dict[Kind, Callable[[Profile, float], Profile]] = {
    "acceptance": scale_acceptance,
    "step": scale_step_time,
    "slope": scale_slope,
}


def workers_profile(cell: Cell) -> Profile:
    """The profile the cell's simulated workers run."""
    if cell.kind == "profile":
        return load_profile(cell.other)
    return _PERTURB[cell.kind](load_profile(cell.believed), cell.factor)


_FACTORS: tuple[tuple[Kind, tuple[float, float]], ...] = (
    ("acceptance", (0.7, 1.3)),
    ("step", (0.7, 1.3)),
    ("slope", (0.5, 2.0)),
)
"""The perturbations of the grid: acceptance and step time ×0.7 / ×1.3, the per-token slope ×0.5 / ×2."""


def grid(family: Sequence[str]) -> list[Cell]:
    """Every cell for every believed profile of ``family`` (the other-profile cells need two profiles)."""
    cells: list[Cell] = []
    for name in family:
        for kind, factors in _FACTORS:
            cells += [Cell(name, kind, f) for f in factors]
        cells += [Cell(name, "profile", other=o) for o in family if o != name]
    return cells


@dataclass(frozen=True, slots=True)
class CellResult:
    cell: Cell
    scenario: str
    goodput_wrong_tok_s: float
    """The controller believing ``cell.believed`` on the cell's workers, tokens/s."""
    goodput_right_tok_s: float
    """The controller believing the workers' own profile (the unperturbed run), tokens/s."""
    mean_k_wrong: float
    mean_k_right: float

    @property
    def loss(self) -> float:
        """Goodput lost to the model error, a fraction of the unperturbed run (negative: it gained)."""
        return 1.0 - self.goodput_wrong_tok_s / self.goodput_right_tok_s if self.goodput_right_tok_s > 0 else 0.0

    @property
    def met(self) -> bool:
        return self.loss <= TARGET_LOSS


def bind(scenario: Scenario, profile: Profile) -> Scenario:
    """``scenario`` on ``profile``'s recipe, every Poisson ``load`` resolved to that profile's capacity."""
    bound = scenario.on(profile)
    capacities = {load.mix_key(bound, p): load.capacity_for(bound, p, profile) for p in load.load_phases(bound)}
    return load.resolve(bound, capacities)


def run_cell(cell: Cell, scenario: Scenario) -> CellResult:
    """Both runs of one cell (deterministic for the scenario's seed)."""
    truth = workers_profile(cell)
    bound = bind(scenario, truth)
    believed = load_profile(cell.believed)
    runs = []
    for model in (believed, truth):
        raw = run_policy(bound, ControllerPolicy(believed=model), profile=truth)
        runs.append(summarise(raw, truth))
    wrong, right = runs
    return CellResult(cell, scenario.name, wrong.goodput_tok_s, right.goodput_tok_s, wrong.mean_k, right.mean_k)


def run_grid(
    cells: Sequence[Cell],
    scenarios: Sequence[Scenario],
    *,
    processes: int | None = None,
    progress: Callable[[str], None] = lambda _: None,
    executor: Executor | None = None,
) -> list[CellResult]:
    """Every cell on every scenario meaningful for its believed profile (``Scenario.fits``), on ``executor``
    (by default ``processes`` worker processes; 1 runs here)."""
    jobs = [(c, sc) for sc in scenarios for c in cells if sc.fits(load_profile(c.believed))]
    results = []
    for (cell, sc), result in zip(jobs, (executor or LocalPool(processes)).map(run_cell, jobs), strict=True):
        results.append(result)
        progress(f"{cell.believed} · {cell.label} · {sc.name}")
    return results


RESULTS = "robustness.json"
"""Every cell's figures beside the report (``write``): a run of some cells replaces those and keeps the rest."""
FULL_COMMAND = "gearshift bench robustness --processes 2"


def _key(r: CellResult) -> tuple[Cell, str]:
    return r.cell, r.scenario


def to_json(r: CellResult) -> dict[str, object]:
    c = r.cell
    return {
        "believed": c.believed, "kind": c.kind, "factor": c.factor, "other": c.other, "scenario": r.scenario,
        "goodput_wrong_tok_s": r.goodput_wrong_tok_s, "goodput_right_tok_s": r.goodput_right_tok_s,
        "mean_k_wrong": r.mean_k_wrong, "mean_k_right": r.mean_k_right,
    }  # fmt: skip


def from_json(d: dict[str, object]) -> CellResult:
    cell = Cell(str(d["believed"]), d["kind"], float(d["factor"]), str(d["other"]))  # type: ignore[arg-type]
    figures = ("goodput_wrong_tok_s", "goodput_right_tok_s", "mean_k_wrong", "mean_k_right")
    return CellResult(cell, str(d["scenario"]), *(float(d[f]) for f in figures))  # type: ignore[arg-type]


def merge(
    kept: Sequence[CellResult], new: Sequence[CellResult], *, family: Sequence[str] | None = None
) -> list[CellResult]:
    """``kept`` with every cell ``new`` ran replaced by its new figures, in the report's order: by believed profile
    (``family``'s order), then scenario (``DEFAULT_SCENARIOS`` first), then the grid's cell order. With ``family``,
    a kept cell whose profiles left the family is dropped."""
    by_key = {_key(r): r for r in kept}
    by_key.update({_key(r): r for r in new})
    order = grid(family) if family is not None else []
    believed = list(family or [])
    if family is not None:
        by_key = {k: r for k, r in by_key.items() if k[0] in order}

    def rank(r: CellResult) -> tuple[int, str, int, str, int, str, str]:
        b = believed.index(r.cell.believed) if r.cell.believed in believed else len(believed)
        s = DEFAULT_SCENARIOS.index(r.scenario) if r.scenario in DEFAULT_SCENARIOS else len(DEFAULT_SCENARIOS)
        c = order.index(r.cell) if r.cell in order else len(order)
        return b, r.cell.believed, s, r.scenario, c, r.cell.kind, f"{r.cell.factor}{r.cell.other}"

    return sorted(by_key.values(), key=rank)


def load_results(path: Path) -> list[CellResult]:
    """The cells stored at ``path`` (none when it does not exist)."""
    if not path.exists():
        return []
    return [from_json(d) for d in json.loads(path.read_text())["cells"]]


def render(results: Sequence[CellResult], *, command: str) -> str:
    """The report: one table per believed profile, then the verdict."""
    lines = [
        "# Robustness: the controller with a wrong model",
        "",
        "The controller believes one profile while the simulated workers run another (`bench.policy.robustness`).",
        "Each cell runs the controller twice on the same workers and trace: believing the base profile (wrong)",
        "and believing the workers' own profile (the unperturbed run). Loss = 1 − wrong / right goodput;",
        f"target: every cell within {TARGET_LOSS:.0%}.",
        "",
        f"Regenerate with `{FULL_COMMAND}`, or a piece at a time "
        "(`--profile P --scenario S`): each run replaces its cells in `robustness.json` and the report is rebuilt "
        f"from all of them. Last run: `{command}`.",
    ]
    for believed in dict.fromkeys(r.cell.believed for r in results):
        mine = [r for r in results if r.cell.believed == believed]
        lines += [
            "",
            f"## Controller believes {believed}",
            "",
            "| cell | scenario | goodput, wrong model (tok/s) | goodput, right model (tok/s) | loss "
            "| mean k wrong / right | within target |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in mine:
            lines.append(
                f"| {r.cell.label} | {r.scenario} | {r.goodput_wrong_tok_s:.0f} | {r.goodput_right_tok_s:.0f} "
                f"| {r.loss:+.1%} | {r.mean_k_wrong:.2f} / {r.mean_k_right:.2f} | {'yes' if r.met else '**no**'} |"
            )
    met = sum(r.met for r in results)
    worst = max(results, key=lambda r: r.loss) if results else None
    lines += ["", f"**{met}/{len(results)} cells within {TARGET_LOSS:.0%}.**"]
    if worst is not None:
        lines.append(f"Worst: {worst.cell.believed} · {worst.cell.label}, {worst.loss:+.1%}.")
    return "\n".join(lines) + "\n"


def write(results: Sequence[CellResult], out: Path, *, command: str, family: Sequence[str] | None = None) -> Path:
    """Merge ``results`` into the cells stored under ``out`` (``RESULTS``: a run of some cells keeps the others,
    ``merge``), store them and write ``robustness.md`` from all of them; returns its path. ``family``: the
    profiles of the grid (default: every built-in profile)."""
    out.mkdir(parents=True, exist_ok=True)
    store = out / RESULTS
    merged = merge(load_results(store), results, family=family_profiles() if family is None else family)
    store.write_text(json.dumps({"cells": [to_json(r) for r in merged]}, indent=1) + "\n")
    path = out / "robustness.md"
    path.write_text(render(merged, command=command))
    return path
