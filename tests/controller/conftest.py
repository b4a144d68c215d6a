"""Shared fixtures of the controller tests: a lab profile with a known break-even batch, estimate builders."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.perf import Profile, load_profile

LAB_PROFILE = Path(__file__).with_name("lab_profile.yaml")


@pytest.fixture(scope="session")
def lab_profile() -> Profile:
    return load_profile(LAB_PROFILE)
