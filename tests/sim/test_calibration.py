"""The default profile reproduces every published figure (DESIGN §1) within ±10 % in virtual time."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fleet.perf import load_profile
from gearshift.cli.sim import sim_app as app
from workers.sim.arrivals import Lengths, WorkloadMix
from workers.sim.crossover import BestKRow, CrossoverRow, best_k_rows, crossover_rows
from workers.sim.figures import (
    GENERAL_MIX,
    TOLERANCE,
    FigureResult,
    load_seed_figures,
    seed_figures_path,
    simulate_figures,
)

SHARED_FIGURES = Path(__file__).resolve().parents[2] / ".." / "shared" / "calibration" / "seed_figures.yaml"
PROFILE = load_profile("kimi-k3-dspark-tp16")


@pytest.fixture(scope="module")
def results() -> dict[str, FigureResult]:
    return {r.figure: r for r in simulate_figures(PROFILE)}


def published_values() -> list[float]:
    """Every number under ``figures`` in the YAML, read independently of the figures module's parser."""
    raw = yaml.safe_load(seed_figures_path().read_text())
    values: list[float] = []
    for fig in raw["figures"]:
        for key, value in fig.items():
            if isinstance(value, dict):
                values.extend(float(v) for v in value.values())
            elif isinstance(value, int | float) and key != "concurrency":
                values.append(float(value))
    return values


def test_packaged_figures_are_the_shared_ones() -> None:
    """The package carries its own copy; beside the project's ../shared checkout it must be identical."""
    packaged = seed_figures_path().read_bytes()
    assert load_seed_figures().figures
    if SHARED_FIGURES.exists():
        assert packaged == SHARED_FIGURES.read_bytes(), "fleet/profiles/calibration/seed_figures.yaml is stale"


def test_every_published_figure_has_a_scenario(results: dict[str, FigureResult]) -> None:
    assert sorted(r.published for r in results.values()) == sorted(published_values())
    assert len(results) == 5


@pytest.mark.parametrize("index", range(5))
def test_figure_is_reproduced_within_tolerance(results: dict[str, FigureResult], index: int) -> None:
    result = sorted(results.values(), key=lambda r: r.figure)[index]
    assert abs(result.simulated - result.published) <= TOLERANCE * result.published, (
        f"{result.figure}: published {result.published}, simulated {result.simulated:.3f} "
        f"({result.error:+.1%}, tolerance ±{TOLERANCE:.0%})"
    )


def test_speculation_beats_no_speculation_for_a_single_maths_stream(results: dict[str, FigureResult]) -> None:
    by_k = {
        k: r.simulated for name, r in results.items() for k in (0, 8) if name.startswith(f"single_stream_math: k={k}")
    }
    assert by_k[8] > 3 * by_k[0]


def test_seed_figures_file_parses_and_rejects_unknown_keys(tmp_path: Path) -> None:
    figures = load_seed_figures()
    assert {f.id for f in figures.figures} == {"single_stream_math", "concurrency_sweep", "long_context_iteration"}
    raw = yaml.safe_load(seed_figures_path().read_text())
    raw["figures"][0]["surprise"] = 1
    bad = tmp_path / "seed_figures.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=r"figures\[0\].*surprise"):
        load_seed_figures(bad)


def test_figures_command_prints_the_table_and_fails_on_a_miss(tmp_path: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["figures"])
    assert ok.exit_code == 0, ok.output
    assert ok.output.count("PASS") == 5
    slow = PROFILE.model_dump(mode="json")
    slow["target"]["step_overhead_s"] *= 2
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(slow))
    miss = runner.invoke(app, ["figures", "--profile", str(path)])
    assert miss.exit_code == 1
    assert "FAIL" in miss.output


def test_k8_pays_alone_and_stops_paying_under_load() -> None:
    maths = WorkloadMix.single("maths", Lengths(300), Lengths(1200))
    rows = {r.name: r for r in crossover_rows(PROFILE, {"mix": GENERAL_MIX, "maths": maths})}
    mix = rows["mix"]
    assert mix.batches[0] == 1
    assert mix.speedups[0] > 1.3, "speculation helps a lone stream of the general mix"
    assert mix.speedups[-1] < 1.0, "and hurts it with a full batch"
    assert mix.loses_from is not None
    assert rows["maths"].speedups[0] > mix.speedups[0]
    assert rows["maths"].tokens_per_step > mix.tokens_per_step


def test_loses_from_is_the_start_of_the_final_losing_run() -> None:
    def row(speedups: tuple[float, ...]) -> CrossoverRow:
        return CrossoverRow("x", 2.0, speedups, (1, 2, 4, 8))

    assert row((2.0, 0.9, 1.1, 0.8)).loses_from == 8
    assert row((2.0, 0.9, 0.95, 0.8)).loses_from == 2
    assert row((2.0, 1.5, 1.1, 1.2)).loses_from is None


def _classes() -> dict[str, WorkloadMix]:
    return {w: WorkloadMix.single(w, Lengths(1000), Lengths(500)) for w in PROFILE.acceptance}


def test_best_k_shrinks_with_load_for_every_class() -> None:
    rows = {r.name: r for r in best_k_rows(PROFILE, {"mix": GENERAL_MIX, **_classes()})}
    assert rows["maths"].best_k[0] == PROFILE.drafter.k_max, "a lone maths stream drafts all it can"
    assert rows["chat"].best_k[0] < rows["maths"].best_k[0]
    for row in rows.values():
        assert row.best_k[-1] < row.best_k[0], f"{row.name}: the best k falls from batch 1 to a full batch"
        assert all(g >= 1.0 for g in row.gains), "the best k is never worse than k = 0"
        assert row.gains[-1] < row.gains[0], f"{row.name}: speculation gains less under load"


def test_k0_becomes_best_once_per_token_cost_outweighs_the_fixed_step() -> None:
    """The crossover the controller acts on: with a token-proportional cost ~0.7 ms (what a chat crossover
    inside 32–64 streams would need, see the profile's header) every class stops speculating."""
    data = PROFILE.model_dump()
    data["target"] = {**data["target"], "comm_s_per_token": 7e-4, "kv_read_replicas": 1.0}
    costly = PROFILE.model_validate(data)
    rows = {r.name: r for r in best_k_rows(costly, _classes())}
    assert rows["chat"].off_from is not None
    assert rows["maths"].off_from is None or rows["maths"].off_from > rows["chat"].off_from
    assert rows["chat"].best_k[0] > 0


def test_off_from_is_the_start_of_the_final_run_of_k0() -> None:
    def row(ks: tuple[int, ...]) -> BestKRow:
        return BestKRow("x", ks, (1.0,) * len(ks), (1, 2, 4, 8))

    assert row((3, 0, 1, 0)).off_from == 8
    assert row((3, 0, 0, 0)).off_from == 2
    assert row((3, 2, 1, 1)).off_from is None


def _note_above(lines: list[str], index: int) -> str:
    """The comment block that documents ``lines[index]``: the nearest one above it within its section
    (parameters may share a note: ``num_experts`` and ``experts_per_token``; a class's ``base`` and gain)."""
    top_level = not lines[index].startswith(" ")
    j = index - 1
    while j >= 0 and not lines[j].lstrip().startswith("#"):
        if top_level or not lines[j].startswith(" "):
            return ""  # reached the section header (or a top-level key) without a note
        j -= 1
    block: list[str] = []
    while j >= 0 and lines[j].lstrip().startswith("#"):
        block.append(lines[j])
        j -= 1
    return " ".join(block)


def test_every_profile_parameter_says_whether_it_is_physical_or_fitted() -> None:
    profile_file = Path(__file__).resolve().parents[2] / "fleet" / "profiles" / "kimi-k3-dspark-tp16.yaml"
    lines = profile_file.read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        key, sep, value = line.strip().partition(":")
        if line.lstrip().startswith("#") or not sep or not value.strip() or key in ("name", "description"):
            continue
        note = _note_above(lines, i)
        if not any(marker in note for marker in ("PHYSICAL", "FITTED", "ASSUMED")):
            undocumented.append(key)
    assert not undocumented, f"profile parameters without a PHYSICAL/FITTED/ASSUMED note: {undocumented}"
