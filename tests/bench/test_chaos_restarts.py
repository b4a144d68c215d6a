"""The chaos bench's restart faults without the bench (``bench.chaos.restarts``): the restarts stack's fleet and
tenants files are ones the services accept, the profile makes drafter-free k = 0 the only gear inside the tight
tier (and every gear fit the standard one), the faults join the matrix but not its ``--fast`` subset, and the
vanishing supervisor passes restarts through, goes after the one it was armed for, and comes back on its port."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import httpx
import pytest

from bench.chaos.faults import FAST, by_name
from bench.chaos.restarts import (
    RELAXED_TPOT_S,
    TIGHT_TPOT_S,
    VanishingSupervisor,
    restart_profile,
    restart_shape,
)
from bench.chaos.stack import LimitSizes, Secrets, tenants_document
from fleet.config import FleetConfig, TenantsConfig
from fleet.perf import load_profile, predict_step
from fleet.restart import RestartCallError, RestartClient, RestartRequest
from tests.sims import sim_servers

TOKEN = "test-control-token"


def test_the_restarts_stack_files_are_valid_and_each_fault_has_its_model(tmp_path: Path) -> None:
    shape = restart_shape(tmp_path)
    workers = cast(list[dict[str, object]], shape.fleet["workers"])
    urls = [{**w, "url": f"http://127.0.0.1:{9000 + i}"} for i, w in enumerate(workers)]
    fleet = FleetConfig.model_validate({**shape.fleet, "workers": urls})
    assert {w.id: (w.model, w.allow_drafter_free) for w in fleet.workers} == {
        "w0": ("kimi-k3", False), "w1": ("kimi-k3", True), "w2": ("kimi-k3-b", False), "w3": ("kimi-k3-b", True),
    }  # fmt: skip
    doc = tenants_document(["restart-fails", "supervisor-unreachable"], LimitSizes(), Secrets(), shape.tenants)
    tenants = TenantsConfig.model_validate(doc)
    models = {t.id: t.models for t in tenants.tenants}
    assert models["restart-fails.free"] == ("kimi-k3",)
    assert models["supervisor-unreachable.budget"] == ("kimi-k3-b",)
    assert shape.sim_env == {1: {"GEARSHIFT_SIM_RESTART_FALLS_BACK": "true"}}


def test_only_drafter_free_k0_meets_the_tight_tier_and_every_gear_the_standard_one(tmp_path: Path) -> None:
    profile = load_profile(restart_profile(tmp_path / "p.yaml"))
    assert profile.serving.restart_s is not None
    assert profile.serving.restart_s < 5
    for batch in (1, 8):
        free = predict_step(profile, batch=batch, k=0, context_per_seq=100).total_s
        loaded = [predict_step(profile, batch=batch, k=k, context_per_seq=100, drafter_loaded=True).total_s
                  for k in range(profile.drafter.k_max + 1)]  # fmt: skip
        assert free < TIGHT_TPOT_S < min(loaded), (batch, free, loaded)  # ~2 % of drafts accepted: TPOT ≈ step
        assert max(loaded) < RELAXED_TPOT_S


def test_the_restart_faults_join_the_matrix_but_not_the_fast_subset() -> None:
    names = [f.name for f in by_name(None)]
    assert names[-2:] == ["restart-fails", "supervisor-unreachable"]
    assert {f.stack for f in by_name(["restart-fails", "supervisor-unreachable"])} == {"restarts"}
    assert {f.stack for f in by_name(list(FAST))} == {"main"}


async def test_the_vanishing_supervisor_goes_after_the_armed_restart_and_comes_back() -> None:
    async with sim_servers(1, speedup=600.0, control_token=TOKEN) as (sim,), httpx.AsyncClient() as http:
        client = RestartClient(http, control_token=TOKEN)
        supervisor = await VanishingSupervisor(sim.url).start()
        try:
            assert (await client.state(supervisor.url)).drafter
            supervisor.armed = True
            accepted = await client.restart(supervisor.url, RestartRequest(drafter=False))
            assert accepted.restarting
            for _ in range(100):
                if supervisor.gone_at is not None:
                    break
                await sim.worker.clock.sleep(0.02)
            with pytest.raises(RestartCallError):
                await client.state(supervisor.url)
            url = supervisor.url
            await supervisor.start()
            assert supervisor.url == url, "back on its port"
            assert (await client.state(supervisor.url)).restarts <= 1
        finally:
            await supervisor.stop()
