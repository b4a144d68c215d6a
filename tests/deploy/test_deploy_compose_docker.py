"""The compose deployment built and run in Docker (scripts/compose-check.sh): heavy, run by
scripts/heavy-tests.sh. It needs root (apt-get, dockerd, debootstrap) and Debian's mirror and PyPI; it pulls no
image from a registry. For the whole heavy set, heavy-tests.sh builds the images in the background first
(compose-check.sh --build-only) and tests/conftest.py runs this test last: its own run waits for that build's lock,
then finds the images made (a build that failed there is retried here, and fails here with its output)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from .deploy_contracts import ROOT

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(1800)]
"""The script's own limit: on a fresh machine it installs Docker, debootstraps a base image and builds the
images (433 s with the images kept, at load 11); pytest's default 120 s killed it mid-build."""


def test_compose_stack_builds_serves_fails_over_and_tears_down() -> None:
    assert os.geteuid() == 0, "scripts/compose-check.sh needs root"
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "compose-check.sh"), "--requests", "20"],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    start = done.stdout.index("{\n")
    result = json.loads(done.stdout[start : done.stdout.index("\n}", start) + 2])
    assert result["ok"], result["failures"]
    assert result["standby_took_over_s"] is not None
    assert result["suspension_seen_by_other_gateway_s"] <= 1.0
    # (a dockerd the script started is stopped again: then nothing answers, and nothing runs)
    projects = subprocess.run(["docker", "compose", "ls", "-a", "-q"], capture_output=True, text=True, check=False)
    assert not [p for p in projects.stdout.split() if p.startswith("gearshift-check-")], "the stack was left running"
