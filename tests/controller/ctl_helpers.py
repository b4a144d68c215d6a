"""Builders shared by the controller tests."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from controller.estimator import Estimate
from fleet.perf import Profile, conditional_acceptance

LAB_PROFILE = Path(__file__).with_name("lab_profile.yaml")
"""A profile with 60× less compute than the default, so that k = 0 wins at moderate batch (the default
profile's best k shrinks with load but never reaches 0: see its header)."""

CONTROL_TOKEN = "test-control-token"
"""The control token of the simulated workers the tests start."""


def make_estimate(profile: Profile, workload: str = "maths", **overrides: Any) -> Estimate:
    """A hand-built, fully observed estimate at the profile's acceptance for ``workload``."""
    base = Estimate(
        worker_id="w0",
        k_current=4,
        k_max=8,
        conditional=conditional_acceptance(profile, workload, 2000),
        observed_positions=4,
        drafts_seen=5000.0,
        batch=1.0,
        context_per_seq=2000.0,
        windows=10,
        accepted_length=3.0,
    )
    return replace(base, **overrides)
