"""The HTTP actuator against a real simulated worker, the cost model, tenant attribution, settings."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from controller.actuator import ActuationError, HttpActuator
from controller.cost import attribute_to_tenants, worker_cost
from controller.policy import Candidate
from controller.settings import ControllerSettings
from controller.sources import HttpScrapeSource, SourceError
from controller.window import Window
from fleet.clock import SystemClock
from fleet.config import WorkerConfig
from fleet.speculation import SpeculationUpdate
from fleet.store.protocol import UsageRecord
from workers.sim.server import SimServer

from .ctl_helpers import CONTROL_TOKEN


def worker(url: str) -> WorkerConfig:
    return WorkerConfig(id="rt-0", url=url, model="kimi-k3")


async def test_http_actuator_applies_with_version_and_lease(sim_server: SimServer) -> None:
    w = worker(sim_server.url)
    async with httpx.AsyncClient() as client:
        act = HttpActuator(client, control_token=CONTROL_TOKEN)
        before = await act.current(w)
        state = await act.apply(w, SpeculationUpdate(k=3, version=before.version + 1, lease_seconds=30, reason="t"))
        assert state.schedule == [[1, 256, 3]]
        assert state.lease_expires_at is not None
        with pytest.raises(ActuationError) as stale:
            await act.apply(w, SpeculationUpdate(k=2, version=before.version, lease_seconds=30))
        assert stale.value.stale_version
        with pytest.raises(ActuationError, match="400"):
            await act.apply(w, SpeculationUpdate(k=99, version=state.version + 1, lease_seconds=30))
        with pytest.raises(ActuationError, match="401") as unauthorised:
            await HttpActuator(client, control_token="wrong").apply(
                w, SpeculationUpdate(k=1, version=state.version + 1, lease_seconds=30)
            )
        assert not unauthorised.value.stale_version
        scrape = await HttpScrapeSource(client, clock=SystemClock()).scrape(w)
        assert scrape.spec_k == 3
        assert scrape.spec_version == state.version


async def test_unreachable_worker_raises_source_and_actuation_errors() -> None:
    w = worker("http://127.0.0.1:9")  # the discard port: nothing listens
    async with httpx.AsyncClient() as client:
        with pytest.raises(SourceError, match="rt-0"):
            await HttpScrapeSource(client, clock=SystemClock(), timeout_s=0.5).scrape(w)
        with pytest.raises(ActuationError, match="rt-0"):
            await HttpActuator(client, control_token="x", timeout_s=0.5).current(w)


def cand(k: int, target_s: float, drafter_s: float, al: float) -> Candidate:
    step = target_s + drafter_s
    return Candidate(k, step, target_s, drafter_s, al, 8 * al / step, step / al, feasible=True, allowed=True)


def window(*, k: int, steps: float, batch: float, al: float, duration_s: float) -> Window:
    drafts = steps * batch if k else 0.0
    accepted = drafts * (al - 1)
    return Window(
        duration_s=duration_s, k=k, drafts=drafts, draft_tokens=drafts * k, accepted=accepted,
        accepted_per_pos=(), preemptions=0, generation_tokens=steps * batch * al, prompt_tokens=0, steps=steps,
        running=batch, waiting=0, kv_usage=0.1, busy=True,
    )  # fmt: skip


def test_cost_of_a_window_with_useful_speculation() -> None:
    usd_per_s = 16 * 3.0 / 3600
    k4, k0 = cand(4, 0.012, 0.002, 3.0), cand(0, 0.010, 0.0, 1.0)
    w = window(k=4, steps=100, batch=8, al=3.0, duration_s=100 * 0.014)  # busy throughout
    cost = worker_cost(usd_per_s=usd_per_s, window=w, current=k4, k0=k0)
    assert cost.usd == pytest.approx(usd_per_s * 1.4)
    assert cost.output_tokens == 2400
    assert cost.usd_per_mtok == pytest.approx(cost.usd / 2400 * 1e6)
    assert cost.drafter_share == pytest.approx(0.002 / 0.014)
    # extra verification 2 ms per step, half of the 4 drafts rejected (2 of 4 accepted on average)
    assert cost.rejected_share == pytest.approx(0.002 * 0.5 / 0.014)
    # at k=0 the same 2400 tokens need 300 steps of 10 ms: 3.0 s instead of 1.4 s
    assert cost.usd_k0 == pytest.approx(usd_per_s * 3.0)
    assert cost.savings_usd > 0


def test_speculation_that_hurts_has_negative_savings() -> None:
    k8, k0 = cand(8, 0.030, 0.004, 1.2), cand(0, 0.012, 0.0, 1.0)
    w = window(k=8, steps=50, batch=64, al=1.2, duration_s=50 * 0.034)
    cost = worker_cost(usd_per_s=0.01, window=w, current=k8, k0=k0)
    assert cost.savings_usd < 0
    assert cost.usd_per_mtok_k0 is not None
    assert cost.usd_per_mtok is not None
    assert cost.usd_per_mtok_k0 < cost.usd_per_mtok


def test_idle_time_is_paid_by_the_tokens_and_kept_in_the_counterfactual() -> None:
    k4, k0 = cand(4, 0.012, 0.002, 3.0), cand(0, 0.010, 0.0, 1.0)
    w = window(k=4, steps=10, batch=1, al=3.0, duration_s=10.0)  # 0.14 s busy in 10 s
    cost = worker_cost(usd_per_s=1.0, window=w, current=k4, k0=k0)
    assert cost.usd == 10.0
    assert cost.usd_k0 == pytest.approx(10.0 - 0.14 + 30 * 0.010)


@pytest.mark.parametrize("duration_s", [0.5, 1.0, 3.0])
def test_the_k0_counterfactual_of_a_k0_window_is_the_actual_cost(duration_s: float) -> None:
    # the model predicts 100 steps × 10 ms = 1 s busy; the window lasted less (model too slow), as long, or longer
    k0 = cand(0, 0.010, 0.0, 1.0)
    w = window(k=0, steps=100, batch=8, al=1.0, duration_s=duration_s)
    cost = worker_cost(usd_per_s=0.01, window=w, current=k0, k0=k0)
    assert cost.usd_k0 == pytest.approx(cost.usd)
    assert cost.savings_usd == pytest.approx(0.0, abs=1e-12)


def test_counterfactual_scales_the_busy_time_when_the_model_over_predicts_it() -> None:
    k4, k0 = cand(4, 0.012, 0.002, 3.0), cand(0, 0.010, 0.0, 1.0)
    w = window(k=4, steps=100, batch=8, al=3.0, duration_s=0.7)  # modelled 1.4 s of steps in a 0.7 s window
    cost = worker_cost(usd_per_s=1.0, window=w, current=k4, k0=k0)
    assert cost.usd_k0 == pytest.approx(0.7 * 3.0 / 1.4)


def record(tenant: str, worker_id: str | None, completion: int, tpot: float | None, prompt: int = 0) -> UsageRecord:
    return UsageRecord(
        request_id=f"{tenant}-{completion}", tenant=tenant, model="kimi-k3", worker_id=worker_id,
        prompt_tokens=prompt, completion_tokens=completion, cost_usd=0.0, status="ok", tpot_s=tpot, at=0.0,
    )  # fmt: skip


ZERO = {"w0": 0.0, "w1": 0.0}
"""No prefill time and no fallback TPOT on either worker (every record below has its TPOT)."""


def test_tenant_attribution_by_batch_slot_time() -> None:
    records = [
        record("a", "w0", 101, 0.01),  # 1.0 slot-second
        record("b", "w0", 301, 0.01),  # 3.0 slot-seconds
        record("a", "w1", 11, 0.1),  # all of w1
        record("c", None, 50, 0.01),  # never reached a worker: no share
        record("d", "w9", 50, 0.01),  # unknown worker: no share
    ]
    shares = attribute_to_tenants(records, {"w0": 8.0, "w1": 2.0}, prefill_s_per_token=ZERO, fallback_tpot_s=ZERO)
    assert shares == pytest.approx({"a": 2.0 + 2.0, "b": 6.0})
    assert sum(shares.values()) == pytest.approx(10.0)


def test_tenant_attribution_counts_prefill() -> None:
    records = [record("a", "w0", 1, None, prompt=1000), record("b", "w0", 1, None, prompt=3000)]
    shares = attribute_to_tenants(records, {"w0": 4.0}, prefill_s_per_token={"w0": 1e-4}, fallback_tpot_s={"w0": 0.02})
    assert shares == pytest.approx({"a": 1.0, "b": 3.0})


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tick_s": 2.0, "schedule_lease_s": 3.0}, "schedule_lease_s"),
        ({"tick_s": 2.0, "leader_lease_s": 2.0}, "leader_lease_s"),
        ({"source": "prometheus"}, "prometheus_url"),
        ({"stabiliser": {"probe_s": 1.0}}, "probe_s"),
        ({"stabiliser": {"probe_interval_s": 3.0, "probe_s": 4.0}}, "probe_interval_s"),
        ({"no_such_setting": 1}, "no_such_setting"),
    ],
)
def test_bad_settings_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        ControllerSettings(**kwargs)


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEARSHIFT_TICK_S", "1.5")
    monkeypatch.setenv("GEARSHIFT_DRY_RUN", "true")
    monkeypatch.setenv("GEARSHIFT_STABILISER__MIN_DWELL_S", "20")
    s = ControllerSettings()
    assert (s.tick_s, s.dry_run, s.stabiliser.min_dwell_s) == (1.5, True, 20.0)
