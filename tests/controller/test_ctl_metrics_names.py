"""The controller's metric names live in controller/metrics.py, and that module defines every one it exports."""

from __future__ import annotations

from controller import metrics as names
from controller.loop import tpot_target
from fleet.config import TenantConfig, TenantsConfig, TierConfig


def test_every_exported_family_is_named_in_the_module() -> None:
    m = names.ControllerMetrics()
    m.k_desired.labels("w").set(1)
    exported = {family.name for family in m.registry.collect()}
    assert exported == set(names.ALL_NAMES)
    assert all(n.startswith("gearshift_controller_") for n in names.ALL_NAMES)


def test_two_registries_do_not_collide() -> None:
    names.ControllerMetrics()
    names.ControllerMetrics()  # no import-time singleton: a second controller in one process is fine


def test_tpot_target_is_the_tightest_tier_allowed_on_the_model() -> None:
    tenants = TenantsConfig(
        tiers={
            "fast": TierConfig(tpot_target_s=0.03),
            "normal": TierConfig(tpot_target_s=0.08),
            "batch": TierConfig(),
        },
        tenants=(
            TenantConfig(id="a", tier="fast", models=("other",)),
            TenantConfig(id="b", tier="normal"),
            TenantConfig(id="c", tier="batch", models=("kimi-k3",)),
        ),
    )
    assert tpot_target("kimi-k3", tenants) == 0.08  # tenant a's 30 ms tier cannot reach kimi-k3
    assert tpot_target("other", tenants) == 0.03
    batch_only = TenantsConfig(tiers={"batch": TierConfig()}, tenants=(TenantConfig(id="c", tier="batch"),))
    assert tpot_target("kimi-k3", batch_only) is None
