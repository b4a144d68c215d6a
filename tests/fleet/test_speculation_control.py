"""The speculation-control contract (DESIGN §3.1): schedule validation and the versioned, leased state."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fleet.clock import ManualClock
from fleet.speculation import (
    ScheduleError,
    SpeculationControl,
    SpeculationUpdate,
    StaleVersionError,
    dense_lookup,
    k_for_batch,
    uniform_schedule,
    validate_schedule,
)


def validate(rows: list[list[int]]) -> tuple[tuple[int, int, int], ...]:
    return validate_schedule(rows, k_max=8, max_num_seqs=256)


def test_a_covering_table_is_accepted() -> None:
    assert validate([[1, 4, 8], [5, 64, 4], [65, 256, 0]]) == ((1, 4, 8), (5, 64, 4), (65, 256, 0))


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([[1, 4, 8], [6, 256, 4]], "schedule[1]: gap: row starts at batch size 6, expected 5"),
        ([[1, 4, 8], [4, 256, 4]], "schedule[1]: overlap: row starts at batch size 4, expected 5"),
        ([[2, 256, 4]], "schedule[0]: gap: row starts at batch size 2, expected 1"),
        ([[1, 100, 4]], "schedule[0]: gap: table ends at batch size 100, must reach max_num_seqs 256"),
        ([[1, 4, 8], [5, 256, 9]], "schedule[1]: k 9 exceeds this worker's k_max 8"),
        ([[1, 256, -1]], "schedule[0]: k -1 is negative"),
        ([[1, 10, 4], [11, 5, 4]], "schedule[1]: to_bs 5 is below from_bs 11"),
        ([[1, 256]], "schedule[0]: must be three integers"),
        ([[1, 256, True]], "schedule[0]: must be three integers"),
        ([], "schedule: must have at least one row"),
    ],
)
def test_bad_tables_are_refused_naming_the_row(rows: list[list[int]], message: str) -> None:
    with pytest.raises(ScheduleError) as info:
        validate(rows)
    assert str(info.value).startswith(message)


def test_lookup_by_batch_size() -> None:
    schedule = validate([[1, 4, 8], [5, 64, 4], [65, 256, 0]])
    assert [k_for_batch(schedule, b) for b in (1, 4, 5, 64, 65, 256, 1000)] == [8, 8, 4, 4, 0, 0, 0]
    dense = dense_lookup(schedule, max_num_seqs=256)
    assert len(dense) == 257
    assert dense[0] == dense[1] == 8
    assert dense[4:6] == [8, 4]
    assert dense[64:66] == [4, 0]
    assert dense[256] == 0
    assert dense_lookup(uniform_schedule(3, max_num_seqs=4), max_num_seqs=4) == [3, 3, 3, 3, 3]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000.0)


@pytest.fixture
def control(clock: ManualClock) -> SpeculationControl:
    return SpeculationControl(
        worker_id="w0",
        method="dspark",
        k_max=8,
        max_num_seqs=256,
        fallback=uniform_schedule(4, max_num_seqs=256),
        clock=clock,
    )


def test_starts_on_the_fallback_schedule(control: SpeculationControl, clock: ManualClock) -> None:
    state = control.state()
    assert (state.version, state.lease_expires_at, state.applied_at) == (0, None, clock.wall())
    assert state.schedule == state.fallback_schedule == [[1, 256, 4]]
    assert control.k_for(100) == 4


def test_apply_installs_a_newer_version_with_a_lease(control: SpeculationControl, clock: ManualClock) -> None:
    clock.advance(5)
    state = control.apply(SpeculationUpdate(schedule=[[1, 8, 8], [9, 256, 2]], version=3, lease_seconds=30))
    assert (state.version, state.applied_at, state.lease_expires_at) == (3, clock.wall(), clock.wall() + 30)
    assert (control.k_for(8), control.k_for(9)) == (8, 2)
    state = control.apply(SpeculationUpdate(k=0, version=4, reason="overload"))
    assert state.schedule == [[1, 256, 0]]
    assert state.reason == "overload"


def test_older_version_is_a_conflict(control: SpeculationControl) -> None:
    control.apply(SpeculationUpdate(k=6, version=5))
    with pytest.raises(StaleVersionError, match="version: 4 is older than the applied version 5"):
        control.apply(SpeculationUpdate(k=2, version=4))
    assert control.k_for(1) == 6


def test_same_version_is_idempotent_and_renews_the_lease(control: SpeculationControl, clock: ManualClock) -> None:
    control.apply(SpeculationUpdate(k=6, version=5, lease_seconds=10))
    clock.advance(8)
    state = control.apply(SpeculationUpdate(k=6, version=5, lease_seconds=10))
    assert (state.version, state.lease_expires_at) == (5, clock.wall() + 10)
    with pytest.raises(StaleVersionError, match="already applied with a different schedule"):
        control.apply(SpeculationUpdate(k=7, version=5))


def test_bad_update_leaves_the_state_alone(control: SpeculationControl) -> None:
    before = control.state()
    with pytest.raises(ScheduleError, match="k_max"):
        control.apply(SpeculationUpdate(k=9, version=1))
    with pytest.raises(ScheduleError, match="exactly one of"):
        control.apply(SpeculationUpdate(k=1, schedule=[[1, 256, 1]], version=1))
    with pytest.raises(ScheduleError, match="exactly one of"):
        control.apply(SpeculationUpdate(version=1))
    assert control.state() == before


def test_lease_expiry_reverts_to_the_fallback(control: SpeculationControl, clock: ManualClock) -> None:
    control.apply(SpeculationUpdate(k=8, version=2, lease_seconds=30))
    clock.advance(29.9)
    assert not control.expire()
    assert control.k_for(1) == 8
    clock.advance(0.1)
    assert control.expire()
    assert not control.expire()  # only once
    state = control.state()
    assert (state.schedule, state.lease_expires_at, state.version) == ([[1, 256, 4]], None, 2)
    assert control.lease_expiries == 1
    assert "lease expired" in state.reason
    with pytest.raises(StaleVersionError):  # the version stays: a late, older PUT is still refused
        control.apply(SpeculationUpdate(k=8, version=1))


def test_update_schema_bounds() -> None:
    with pytest.raises(ValidationError, match="lease_seconds"):
        SpeculationUpdate(k=1, version=1, lease_seconds=0)
    with pytest.raises(ValidationError, match="version"):
        SpeculationUpdate(k=1, version=-1)
    with pytest.raises(ValidationError, match="extra"):
        SpeculationUpdate.model_validate({"k": 1, "version": 1, "colour": "red"})


def test_renewing_the_same_version_after_expiry_reapplies_it(control: SpeculationControl, clock: ManualClock) -> None:
    control.apply(SpeculationUpdate(k=8, version=3, lease_seconds=5))
    clock.advance(6)
    assert control.expire()
    assert control.k_for(1) == 4
    state = control.apply(SpeculationUpdate(k=8, version=3, lease_seconds=5))  # a late renewal of the same decision
    assert state.schedule == [[1, 256, 8]]
    with pytest.raises(StaleVersionError, match="already applied with a different schedule"):
        control.apply(SpeculationUpdate(k=2, version=3))
