"""The simulated worker's samples built directly equal, field by field and in order, those of its Prometheus metric
families (the lab's controller reads the direct ones at every tick; ``/metrics`` renders the families)."""

from __future__ import annotations

import pytest

from fleet.clock import ManualClock
from fleet.perf import load_profile
from fleet.speculation import SpeculationUpdate
from workers.sim.arrivals import Lengths, RequestKind, WorkloadMix, poisson
from workers.sim.exposition import SimWorkerMetrics
from workers.sim.virtual import VirtualLab, make_worker

PROFILE = load_profile("kimi-k3-dspark-tp16")


def _typed(samples: list[tuple[str, dict[str, str], float]]) -> list[tuple[object, ...]]:
    """Each sample with its value's type, so 1 and 1.0 differ."""
    return [(name, labels, type(value), value) for name, labels, value in samples]


@pytest.mark.parametrize("adaptive", [False, True])
def test_direct_samples_equal_the_families_samples_after_a_busy_run(adaptive: bool) -> None:
    clock = ManualClock()
    worker = make_worker(PROFILE, "w0", clock, k=5, seed=2, adaptive_verification=adaptive, max_num_seqs=4)
    mix = WorkloadMix((RequestKind("chat", Lengths(300, 0.5), Lengths(60, 0.5)),))
    lab = VirtualLab([worker], poisson(8.0, mix), clock=clock, seed=4)
    metrics = SimWorkerMetrics(
        lambda: worker.engine.stats,
        worker.control,
        model_name=worker.model_name,
        engine_index=3,
        adaptive_verification=lambda: worker.engine.adaptive is not None,
    )
    assert _typed(list(metrics.samples())) == _typed(list(metrics.family_samples())), "before any request"
    lab.run(20.0)
    worker.control.apply(SpeculationUpdate(schedule=[[1, 2, 5], [3, 4, 2]], version=3, lease_seconds=1.0))
    assert worker.stats.num_drafts > 0, "the run drafted"
    assert worker.stats.waiting > 0, "and queued"
    assert _typed(list(metrics.samples())) == _typed(list(metrics.family_samples())), "a two-row schedule"
    clock.advance(5.0)
    assert worker.control.expire()
    assert _typed(list(metrics.samples())) == _typed(list(metrics.family_samples())), "a lease expired"
    assert _typed(list(worker.metrics_samples())) == _typed(list(worker._metrics.family_samples()))
