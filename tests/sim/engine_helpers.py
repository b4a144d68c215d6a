"""Builders shared by the simulator's engine tests."""

from __future__ import annotations

from fleet.clock import ManualClock
from fleet.perf import Profile, load_profile
from fleet.speculation import Schedule, SpeculationControl
from workers.sim.engine import EngineCore, SimRequest, StepOutcome
from workers.sim.scheduler import SchedulingPolicy

PROFILE: Profile = load_profile("kimi-k3-dspark-tp16")


def make_engine(
    *,
    schedule: Schedule = ((1, 256, 4),),
    max_num_seqs: int = 256,
    scheduling: SchedulingPolicy = "fcfs",
    seed: int = 0,
    kv_capacity_tokens: int | None = None,
    max_num_batched_tokens: int | None = None,
    clock: ManualClock | None = None,
    drafter_loaded: bool = True,
) -> EngineCore:
    control = SpeculationControl(
        worker_id="w0",
        method="dspark",
        k_max=PROFILE.drafter.k_max,
        max_num_seqs=max_num_seqs,
        fallback=schedule,
        clock=clock or ManualClock(),
    )
    return EngineCore(
        PROFILE,
        control,
        max_num_seqs=max_num_seqs,
        scheduling=scheduling,
        seed=seed,
        kv_capacity_tokens=kv_capacity_tokens,
        max_num_batched_tokens=max_num_batched_tokens,
        drafter_loaded=drafter_loaded,
    )


def req(rid: str, prompt: int = 100, max_tokens: int = 50, *, workload: str = "chat", priority: int = 0) -> SimRequest:
    return SimRequest(request_id=rid, prompt_tokens=prompt, max_tokens=max_tokens, workload=workload, priority=priority)


def step(engine: EngineCore) -> StepOutcome:
    """One step, advancing the engine clock as a driver would."""
    out = engine.step()
    engine.now_s += out.duration_s
    return out


def run_to_completion(engine: EngineCore, *, max_steps: int = 100_000) -> tuple[list[StepOutcome], dict[str, int]]:
    """Step until idle; returns the outcomes and the tokens each request received in total."""
    outcomes: list[StepOutcome] = []
    received: dict[str, int] = {}
    for _ in range(max_steps):
        if not engine.has_work():
            return outcomes, received
        out = step(engine)
        outcomes.append(out)
        for rid, n in out.emitted.items():
            received[rid] = received.get(rid, 0) + n
    raise AssertionError(f"engine still busy after {max_steps} steps")
