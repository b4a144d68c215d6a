"""A short soak (``gearshift bench soak`` runs the long one): two ``gearshift gateway`` processes on a real Redis
in front of simulated worker processes, streaming clients of several tenants; asserts the invariants, not speed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak import report as soak_report
from bench.soak.run import SoakConfig, run_soak
from bench.soak.stack import SoakTenant

pytestmark = [pytest.mark.slow, pytest.mark.redis]

TENANTS = (
    SoakTenant("acme", "interactive", 0.4, keys=2),
    SoakTenant("initech", "batch", 0.3, keys=2),
    SoakTenant("hooli", "standard", 0.15, keys=1),
    SoakTenant("umbrella", "batch", 0.15, keys=1, rpm=6),
)


async def test_mini_soak_keeps_the_invariants(tmp_path: Path) -> None:
    cfg = SoakConfig(clients=30, duration_s=12.0, warmup_s=4.0, sample_s=2.0, workers=2, replicas=2, speedup=4.0,
                     min_tokens=8, max_tokens=48, settle_s=2.0, tenants=TENANTS)  # fmt: skip
    result = await run_soak(cfg, tmp_path)
    by_name = {c.name: c for c in soak_report.checks(result)}
    intended, unintended = soak_report.errors_by_type(result)
    assert not unintended, unintended
    assert intended, "the limited tenant never hit its limit: the 429 path was not exercised"
    assert by_name["usage ledger = client counts (per tenant)"].met, by_name[
        "usage ledger = client counts (per tenant)"
    ]
    exact = soak_report.request_ledger(result)
    assert exact.differences == 0, exact
    assert exact.answered == sum(1 for f in result.finished if f.result.ok)
    assert by_name["client connections at the end = at the start"].met
    served = sum(1 for f in result.finished if f.result.ok)
    assert served >= cfg.clients
    assert all(f.result.role_events == 1 for f in result.finished if f.result.ok)
    path = soak_report.write(result, tmp_path / "out", command="test")
    assert "usage ledger" in path.read_text()
