"""The fallback start-up table (``fleet.fallback``) against the one the launcher wrote before it."""

from __future__ import annotations

import json

import pytest

from fleet.capacity import best_k, max_batch
from fleet.config import load_fleet
from fleet.fallback import dense, fallback_table, general_mix, goodput, rows_of, tuned_table
from fleet.perf import load_profile
from tests.vllm.test_gears import KIMI_FLEET
from workers.vllm.gears import gear_plan, gear_priority
from workers.vllm.launcher import build_launch

PROFILES = ("kimi-k3-dspark-tp16", "kimi-k3-dspark-b300-tp8", "kimi-k3-dspark-mi355x-tp8")


def _tables(name: str, seqs: int) -> tuple[list[int], list[int], list[int]]:
    """(today's dense table, the fallback's, the fallback's sacrificial batch sizes)."""
    profile = load_profile(name)
    k_max = profile.drafter.k_max
    gears = sorted(gear_priority(k_max)[:seqs])
    mix = general_mix(profile)
    tuned = dense(tuned_table(profile, mix, seqs, bands=range(1, seqs + 1)), seqs)
    new = dense(fallback_table(profile, mix, max_num_seqs=seqs, gears=gears), seqs)
    sacrificed = [b for b in range(1, seqs + 1) if new[b - 1] != tuned[b - 1]]
    return dense(gear_plan(k_max=k_max, max_num_seqs=seqs).table, seqs), new, sacrificed


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("seqs", [8, 32])
def test_every_gear_keeps_a_row(name: str, seqs: int) -> None:
    k_max = load_profile(name).drafter.k_max
    _, new, _ = _tables(name, seqs)
    assert set(new) == set(gear_priority(k_max)[:seqs])


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("seqs", [8, 32])
def test_the_fallback_is_no_worse_where_it_differs_except_on_its_sacrificial_rows(name: str, seqs: int) -> None:
    profile, (old, new, sacrificed) = load_profile(name), _tables(name, seqs)
    mix = general_mix(profile)
    assert len(sacrificed) <= profile.drafter.k_max + 1
    for batch in range(1, seqs + 1):
        if old[batch - 1] != new[batch - 1] and batch not in sacrificed:
            assert goodput(profile, mix, batch, new[batch - 1]) >= goodput(profile, mix, batch, old[batch - 1])


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("seqs", [32, 128])
def test_the_fallback_is_no_worse_off_the_rows_just_under_the_full_batch(name: str, seqs: int) -> None:
    """Off the rows just under the reach (where a filling or draining batch only passes through) the fallback is
    no worse than today's table at any batch size, the full batch included. On those rows a sacrificial k costs
    about as much as today's did there (not asserted: one more of them, since the full batch keeps its k)."""
    profile, (old, new, sacrificed) = load_profile(name), _tables(name, seqs)
    mix = general_mix(profile)
    reach = max_batch(profile, mix, seqs)
    top = range(max(2, reach - len(sacrificed)), reach + 1)
    assert len(top) - 1 >= len(sacrificed)
    for batch in range(1, reach + 1):
        if batch not in top:
            assert goodput(profile, mix, batch, new[batch - 1]) >= goodput(profile, mix, batch, old[batch - 1])
    assert new[reach - 1] == best_k(profile, mix, reach)
    assert goodput(profile, mix, reach, new[reach - 1]) >= goodput(profile, mix, reach, old[reach - 1])


def test_tp16_no_longer_runs_k0_at_the_full_batch() -> None:
    old, new, _ = _tables("kimi-k3-dspark-tp16", 32)
    assert old[31] == 0
    assert new[31] > 0


def test_rows_round_trip_and_an_uncovered_batch_is_refused() -> None:
    assert dense(rows_of([7, 7, 0, 7]), 4) == [7, 7, 0, 7]
    assert rows_of([7, 7, 0, 7]) == ((1, 2, 7), (3, 3, 0), (4, 4, 7))
    with pytest.raises(ValueError, match="uncovered"):
        dense(((1, 2, 7),), 4)


def test_more_gears_than_batch_sizes_is_refused() -> None:
    profile = load_profile("kimi-k3-dspark-tp16")
    with pytest.raises(ValueError, match="max_num_seqs"):
        fallback_table(profile, general_mix(profile), max_num_seqs=2, gears=[0, 1, 7])


def test_the_launcher_writes_the_fallback_table_given_the_profile() -> None:

    worker = load_fleet(KIMI_FLEET).worker("kimi-k3-0")
    assert worker is not None
    profile = load_profile("kimi-k3-dspark-tp16")
    argv = list(build_launch(worker, profile=profile).argv)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    gears = sorted(gear_priority(worker.drafter.k_max)[: worker.max_num_seqs])
    expected = fallback_table(profile, general_mix(profile), max_num_seqs=worker.max_num_seqs, gears=gears)
    assert spec["num_speculative_tokens_per_batch_size"] == [list(r) for r in expected]
