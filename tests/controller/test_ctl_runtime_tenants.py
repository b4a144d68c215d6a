"""The controller serves the tenants in force, not only the tenants file: a tenant re-tiered or created through
the admin API (the gateway's ``TenantBook`` writing the store's ``tenants`` collection) moves the TPOT/TTFT targets
the controller decides against at its next tick, on the in-memory store and on a real Redis, with no restart."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from bench.policy.controller_lab import lab_controller, run_lab
from fleet.clock import ManualClock
from fleet.config import TenantConfig, TenantsConfig, TierConfig
from fleet.perf import Profile
from fleet.store.memory import MemoryStore
from fleet.store.protocol import Store
from fleet.store.redis import RedisStore
from gateway.intake.tenant_book import TenantBook
from gateway.usage import audit
from workers.sim.arrivals import Lengths, Phase, PhasedLoad, WorkloadMix
from workers.sim.virtual import VirtualLab, make_worker

TIERS = {
    "fast": TierConfig(tpot_target_s=0.03, ttft_target_s=1.5),
    "slow": TierConfig(tpot_target_s=0.25, ttft_target_s=20.0),
    "bulk": TierConfig(),
}
FILE = TenantsConfig(tiers=TIERS, tenants=(TenantConfig(id="acme", tier="slow"),))
MIX = WorkloadMix.single("chat", Lengths(200, 0.3), Lengths(200, 0.3))

ENTRY = audit.entry(who="admin", action="tenant.update", target="-", now=0.0)
"""The audit entry a run-time change is stored with (one write)."""


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request: pytest.FixtureRequest, clock: ManualClock) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore(clock=clock)
        return
    redis = RedisStore.from_url(request.getfixturevalue("redis_url"), prefix=f"test:{uuid.uuid4().hex[:12]}:")
    await redis.verify()
    try:
        yield redis
    finally:
        await redis.close()


class DocsOutage(MemoryStore):
    """A memory store whose documents cannot be read while ``broken``."""

    broken = False

    async def docs(self, collection: str) -> dict[str, str]:
        if self.broken:
            raise ConnectionError("store away")
        return await super().docs(collection)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


async def test_a_run_time_tier_change_reaches_the_controller_without_a_restart(
    store: Store, clock: ManualClock, lab_profile: Profile
) -> None:
    workers = [make_worker(lab_profile, "w0", clock, k=4, seed=1)]
    vlab = VirtualLab(workers, PhasedLoad([Phase(1000, MIX, concurrency=2)]), clock=clock)
    ctl = lab_controller(workers, lab_profile, clock, tenants=FILE, store=store)
    book = TenantBook(FILE, store, on_change=lambda _: None)
    rt = ctl.workers["w0"]
    await run_lab(vlab, ctl, until_s=4, tick_s=2)
    assert (rt.tpot_target_s, rt.ttft_target_s) == (TIERS["slow"].tpot_target_s, TIERS["slow"].ttft_target_s)

    acme = FILE.tenants[0]
    await book.save(
        "acme", acme.model_copy(update={"tier": "fast"}), by="admin", now=clock.wall(), log=audit.LOG, entry=ENTRY
    )
    await run_lab(vlab, ctl, until_s=6, tick_s=2)
    assert (rt.tpot_target_s, rt.ttft_target_s) == (TIERS["fast"].tpot_target_s, TIERS["fast"].ttft_target_s)
    assert ctl.tenants.tenant("acme") == acme.model_copy(update={"tier": "fast"})

    await book.save(
        "acme", acme.model_copy(update={"tier": "bulk"}), by="admin", now=clock.wall(), log=audit.LOG, entry=ENTRY
    )
    await book.save(
        "newco",
        TenantConfig(id="newco", tier="slow", models=("kimi-k3",)),
        by="admin",
        now=clock.wall(),
        log=audit.LOG,
        entry=ENTRY,
    )
    await run_lab(vlab, ctl, until_s=8, tick_s=2)
    assert ctl.tenants.tenant("newco") is not None, "a tenant created at run time is seen"
    assert rt.tpot_target_s == TIERS["slow"].tpot_target_s, "the tightest tier left is the new tenant's"

    await book.save("newco", None, by="admin", now=clock.wall(), log=audit.LOG, entry=ENTRY)
    await run_lab(vlab, ctl, until_s=10, tick_s=2)
    assert (rt.tpot_target_s, rt.ttft_target_s) == (None, None), "only a bulk tenant is left"


async def test_a_store_that_fails_keeps_the_tenants_last_read_and_counts_the_failure(
    clock: ManualClock, lab_profile: Profile
) -> None:
    store = DocsOutage(clock=clock)
    workers = [make_worker(lab_profile, "w0", clock, k=4, seed=1)]
    vlab = VirtualLab(workers, PhasedLoad([Phase(1000, MIX, concurrency=2)]), clock=clock)
    ctl = lab_controller(workers, lab_profile, clock, tenants=FILE, store=store)
    await TenantBook(FILE, store, on_change=lambda _: None).save(
        "acme",
        FILE.tenants[0].model_copy(update={"tier": "fast"}),
        by="admin",
        now=clock.wall(),
        log=audit.LOG,
        entry=ENTRY,
    )
    await run_lab(vlab, ctl, until_s=2, tick_s=2)
    store.broken = True
    await run_lab(vlab, ctl, until_s=4, tick_s=2)
    assert ctl.workers["w0"].tpot_target_s == TIERS["fast"].tpot_target_s
    assert ctl.workers["w0"].estimate is not None, "the tick went on"
    assert ctl.metrics.registry.get_sample_value("gearshift_controller_tick_failures_total") == 1
