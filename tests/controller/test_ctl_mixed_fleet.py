"""A fleet of two profiles: the controller weighs each worker's work with that worker's own profile (its prefill
seconds per token and, for a request without a measured TPOT, its profile's single-stream TPOT), never the first
worker's nor a hard-coded figure."""

from __future__ import annotations

import pytest

from controller.actuator import ControlActuator
from controller.cost import prefill_seconds_per_token, profile_tpot_s
from controller.loop import Controller
from controller.settings import ControllerSettings
from controller.sources import SampleSource
from fleet.clock import ManualClock
from fleet.config import FleetConfig, ModelConfig, TenantConfig, TenantsConfig, TierConfig, WorkerConfig
from fleet.perf import load_profile
from fleet.store.memory import MemoryStore
from fleet.store.protocol import UsageRecord

PROFILES = {"m-tp16": "kimi-k3-dspark-tp16", "m-mi355x": "kimi-k3-dspark-mi355x-tp8"}


def _controller(clock: ManualClock) -> Controller:
    fleet = FleetConfig(
        models=tuple(ModelConfig(name=m, profile=p) for m, p in PROFILES.items()),
        workers=(
            WorkerConfig(id="w0", url="http://w0.invalid", model="m-tp16"),
            WorkerConfig(id="w1", url="http://w1.invalid", model="m-mi355x"),
        ),
    )
    tenants = TenantsConfig(
        tiers={"t": TierConfig()}, tenants=(TenantConfig(id="a", tier="t"), TenantConfig(id="b", tier="t"))
    )
    return Controller(
        fleet=fleet,
        tenants=tenants,
        settings=ControllerSettings(tenant_interval_s=1000.0),
        source=SampleSource({}, clock=clock),
        actuator=ControlActuator({}),
        store=MemoryStore(clock=clock),
        clock=clock,
    )


async def test_each_worker_is_weighed_with_its_own_profile() -> None:
    clock = ManualClock()
    ctl = _controller(clock)
    assert ctl.workers["w1"].profile.name == PROFILES["m-mi355x"]
    at = clock.wall()
    # On the second worker (the other profile): tenant a sends long prompts, tenant b long outputs without a TPOT.
    for tenant, prompt, completion in (("a", 8000, 1), ("b", 0, 201)):
        await ctl.store.append_usage(
            UsageRecord(request_id=tenant, tenant=tenant, model="m-mi355x", worker_id="w1", prompt_tokens=prompt,
                        completion_tokens=completion, cost_usd=0.0, status="ok", tpot_s=None, at=at)
        )  # fmt: skip
    ctl.workers["w1"].usd_since_attribution = 1.0
    clock.advance(1.0)
    shares = await ctl.attribute_tenants()
    own = load_profile(PROFILES["m-mi355x"])
    a = 8000 * prefill_seconds_per_token(own)
    b = 200 * profile_tpot_s(own)
    assert shares == pytest.approx({"a": a / (a + b), "b": b / (a + b)}, rel=1e-9)
