"""The lab's executors (``bench.executor``): the local pool and Ray run the same jobs to the same results, in job
order; the policy suite and the replay give identical figures on either."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from bench.executor import Executor, LocalPool, RayPool, make_executor
from bench.policy.report import summary_json
from bench.policy.scenario import Scenario
from bench.policy.suite import SuiteResult, run_family
from bench.replay.run import ReplayResult, replay
from bench.replay.scenario import plan_replay
from bench.replay.trace import TraceRequest, rebase
from fleet.perf import load_profile
from gearshift.cli.app import app

PROFILE = load_profile("kimi-k3-dspark-tp16")
CHAT = [{"workload": "chat", "tier": "interactive", "output_tokens": {"mean": 50}, "prompt_tokens": {"mean": 200}}]


def _times(shared: int, x: int) -> tuple[int, int]:
    return shared * x, os.getpid()


def _pid(x: int) -> tuple[int, int]:
    return x, os.getpid()


def test_the_local_pool_keeps_job_order_in_this_process_or_in_its_workers() -> None:
    jobs = [(i,) for i in range(7)]
    here = list(LocalPool(1).map(_times, jobs, shared=3))
    there = list(LocalPool(2).map(_times, jobs, shared=3))
    assert [v for v, _ in here] == [v for v, _ in there] == [3 * i for i in range(7)]
    assert {pid for _, pid in here} == {os.getpid()}
    assert os.getpid() not in {pid for _, pid in there}, "processes > 1 runs the jobs in worker processes"
    assert [v for v, _ in LocalPool(2).map(_pid, jobs)] == list(range(7)), "without shared, fn(*job)"


def test_make_executor_names_the_two_pools() -> None:
    assert isinstance(make_executor("local", processes=3), LocalPool)
    assert make_executor("local", processes=3).processes == 3  # type: ignore[attr-defined]
    assert isinstance(make_executor("ray"), RayPool)
    with pytest.raises(ValueError, match="--executor"):
        make_executor("dask")


def _scenarios() -> list[Scenario]:
    closed = {
        "name": "tiny-closed", "description": "two short closed-loop phases", "workers": 1, "max_num_seqs": 64,
        "phases": [
            {"name": "one", "duration_s": 6, "arrival": {"kind": "closed", "concurrency": 4}, "mix": CHAT},
            {"name": "two", "duration_s": 6, "arrival": {"kind": "closed", "concurrency": 8}, "mix": CHAT},
        ],
    }  # fmt: skip
    poisson = {
        "name": "tiny-poisson", "description": "Poisson at half the measured capacity", "workers": 1,
        "max_num_seqs": 32, "seed": 5,
        "phases": [{"name": "half", "duration_s": 8, "arrival": {"kind": "poisson", "load": 0.5}, "mix": CHAT}],
    }  # fmt: skip
    return [Scenario.model_validate({**raw, "profile": PROFILE.name}) for raw in (closed, poisson)]


def _family(pool: Executor) -> dict[str, SuiteResult]:
    return run_family([PROFILE], _scenarios(), executor=pool)


def _replay(pool: Executor) -> ReplayResult:
    trace = rebase(
        [
            TraceRequest(
                arrival_s=100.0 + 1.3 * i, prompt_tokens=120 + 31 * i, output_tokens=6 + (i * 7) % 30,
                tenant="acme" if i % 2 else "bulk", tier="interactive" if i % 2 else "batch",
            )
            for i in range(30)
        ],
        source="executor",
    )  # fmt: skip
    plan = plan_replay(trace, PROFILE, profile_path=PROFILE.name, workers=2, phase_s=20.0)
    return replay(plan, executor=pool)


def _replay_figures(result: ReplayResult) -> dict[str, str]:
    """Each policy's metrics and tiers (not its wall time)."""
    return {name: repr((run.metrics, run.tiers)) for name, run in result.runs.items()}


@pytest.fixture(scope="module")
def ray_pool() -> Iterator[RayPool]:
    """A single-node Ray cluster on this machine. Ray 2.60 has no local mode (``ray.init(local_mode=True)``
    raises "no longer supported"); its testing guide's replacement is a small local cluster, ``num_cpus`` fixed."""
    pytest.importorskip("ray", reason="the ray extra (pip install -e '.[ray]'; the bench extra includes it)")
    pool = RayPool(num_cpus=2)
    yield pool
    pool.close()


@pytest.mark.slow  # Ray's start: ~5-20 s by the machine's load
def test_ray_runs_the_jobs_elsewhere_in_job_order(ray_pool: RayPool) -> None:
    jobs = [(i,) for i in range(7)]
    got = list(ray_pool.map(_times, jobs, shared=3))
    assert [v for v, _ in got] == [3 * i for i in range(7)]
    assert os.getpid() not in {pid for _, pid in got}, "Ray tasks run in Ray's worker processes"


@pytest.mark.slow  # Ray's start: ~5-20 s by the machine's load
def test_ray_gives_the_local_pools_policies_json_and_runs(ray_pool: RayPool) -> None:
    local, remote = _family(LocalPool(2)), _family(ray_pool)
    assert json.dumps(summary_json(local), sort_keys=True) == json.dumps(summary_json(remote), sort_keys=True)
    (name,) = local
    assert local[name].runs.keys() == remote[name].runs.keys()
    assert len(local[name].runs) > 10
    assert repr(local[name].runs) == repr(remote[name].runs), "every run's metrics, field by field"
    assert local[name].capacities == remote[name].capacities, "the Poisson scenario's capacity was measured"


@pytest.mark.slow  # Ray's start: ~5-20 s by the machine's load
def test_ray_gives_the_local_pools_replay(ray_pool: RayPool) -> None:
    local, remote = _replay(LocalPool(2)), _replay(ray_pool)
    assert _replay_figures(local) == _replay_figures(remote)
    assert local.oracle_choice == remote.oracle_choice


@pytest.mark.parametrize("command", ["policies", "robustness"])
def test_the_sweep_commands_refuse_an_unknown_executor_by_name(command: str) -> None:
    result = CliRunner().invoke(app, ["bench", command, "--executor", "dask", "--scenario", "phase-shift"])
    assert result.exit_code == 2
    assert "--executor: one of local, ray, got 'dask'" in result.output
