"""The idle-drafter tax in two terms (issue 24): ``stock`` (vLLM's own k = 0) and ``plugin`` (the gearshift
plugin's skip), carried by every GPU profile and charged by the simulator by the worker's mode."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from fleet.clock import ManualClock
from fleet.perf import IdleDrafterMode, StepShape, load_profile, step_time
from fleet.speculation import SpeculationControl
from workers.sim.engine import EngineCore
from workers.sim.settings import SimWorkerSettings

from .engine_helpers import req, run_to_completion

PROFILES = sorted(Path(str(resources.files("fleet.profiles"))).glob("*.yaml"))


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_every_profile_with_a_stock_term_carries_a_smaller_plugin_term(path: Path) -> None:
    drafter = load_profile(path).drafter
    stock, plugin = drafter.idle_tax(IdleDrafterMode.STOCK), drafter.idle_tax(IdleDrafterMode.PLUGIN)
    assert stock is not None
    assert plugin is not None
    assert plugin is not stock
    for batch in range(1, 2 * stock.high_batch):
        assert 0 < plugin.fraction(batch) < stock.fraction(batch)


@pytest.mark.parametrize("mode", list(IdleDrafterMode))
def test_a_k0_step_with_the_drafter_loaded_pays_the_term_of_its_mode(mode: IdleDrafterMode) -> None:
    profile = load_profile("kimi-k3-dspark-tp16")
    term = profile.drafter.idle_tax(mode)
    assert term is not None
    for batch in (1, 8, 32):
        free = step_time(profile, StepShape(batch, 0, batch * 4000))
        loaded = step_time(profile, StepShape(batch, 0, batch * 4000, drafter_loaded=True, idle_drafter=mode))
        assert loaded.target_s == free.target_s
        assert loaded.drafter_s == pytest.approx(free.target_s * term.fraction(batch))
        k4 = StepShape(batch, 4, batch * 4000, drafter_loaded=True)
        other = StepShape(batch, 4, batch * 4000, drafter_loaded=True, idle_drafter=mode)
        assert step_time(profile, k4) == step_time(profile, other)  # k > 0: no tax term, whatever the mode


def test_a_profile_without_a_plugin_term_charges_a_plugin_worker_the_stock_term() -> None:
    profile = load_profile("kimi-k3-dspark-tp16")
    bare = profile.model_copy(update={"drafter": profile.drafter.model_copy(update={"k0_tax_plugin": None})})
    shape = StepShape(8, 0, 32000, drafter_loaded=True, idle_drafter=IdleDrafterMode.PLUGIN)
    assert step_time(bare, shape) == step_time(profile, StepShape(8, 0, 32000, drafter_loaded=True))


def test_the_simulated_engine_charges_its_modes_term_at_k0() -> None:
    profile = load_profile("kimi-k3-dspark-tp16")
    seconds = {}
    for mode in IdleDrafterMode:
        control = SpeculationControl(
            worker_id="w0", method="dspark", k_max=profile.drafter.k_max, max_num_seqs=64,
            fallback=((1, 64, 0),), clock=ManualClock(),
        )  # fmt: skip
        engine = EngineCore(profile, control, max_num_seqs=64, idle_drafter=mode)
        for i in range(8):
            engine.add(req(f"r{i}", max_tokens=40))
        outcomes, _ = run_to_completion(engine)
        term = profile.drafter.idle_tax(mode)
        assert term is not None
        decode = [o for o in outcomes if o.decode_seqs]
        assert all(o.drafter_s == pytest.approx(o.target_s * term.fraction(o.decode_seqs)) for o in decode)
        seconds[mode] = sum(o.target_s + o.drafter_s for o in outcomes)
    assert seconds[IdleDrafterMode.PLUGIN] < seconds[IdleDrafterMode.STOCK]


def test_a_simulated_worker_takes_its_mode_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert SimWorkerSettings().idle_drafter is IdleDrafterMode.STOCK
    monkeypatch.setenv("GEARSHIFT_SIM_IDLE_DRAFTER", "plugin")
    assert SimWorkerSettings().idle_drafter is IdleDrafterMode.PLUGIN


def test_the_plugin_view_of_a_profile_charges_the_plugin_term_wherever_k0_tax_is_read() -> None:
    profile = load_profile("kimi-k3-dspark-tp16")
    assert profile.with_idle_drafter(IdleDrafterMode.STOCK) is profile
    view = profile.with_idle_drafter(IdleDrafterMode.PLUGIN)
    assert view.drafter.k0_tax == profile.drafter.k0_tax_plugin
    shape = StepShape(16, 0, 64000, drafter_loaded=True)
    plugin = StepShape(16, 0, 64000, drafter_loaded=True, idle_drafter=IdleDrafterMode.PLUGIN)
    assert step_time(view, shape) == step_time(profile, plugin)
