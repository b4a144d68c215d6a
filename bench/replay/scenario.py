"""A trace bound to a fleet: the lab scenario that measures it, and what each traced request runs as.

**Phases.** A phase is a fixed window of the trace (``phase_s``, 5 minutes by default); the last ends 1 s after
the last arrival (or at ``window_s``). The per-phase oracle picks its k per window, and the report breaks goodput
down by window.
Each phase's mix is what arrived in it (its workloads and tiers, weighted by count, with their mean lengths): the
lab's capacity estimates read it; the arrivals themselves come from the trace (``bench.replay.load``).

**Tiers.** From the tenants file when one is given (its tiers, and each tenant's tier), otherwise the lab's two
default tiers (``interactive`` and ``batch``). A request's tier is the one it was recorded with, else its tenant's,
else ``batch``. A tier that is not defined is an error naming it.

**Acceptance.** A traced request runs as an acceptance class of the profile. In order: its workload hint when
the profile has that class; else the class its tenant maps to (``class_map``: from ``--class-map tenant=class``,
or measured from the store, ``bench.replay.acceptance``); else the profile's ``default_workload``. Hints the
profile does not know are counted (``ReplayPlan.unknown_hints``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from bench.policy.scenario import Poisson, Scenario, ScenarioPhase, TrafficClass
from bench.replay.load import TraceReplay
from bench.replay.trace import Trace, TraceRequest
from fleet.config import ConfigError, TenantsConfig, TierConfig
from fleet.perf import Profile
from workers.sim.arrivals import Lengths, RequestSpec

DEFAULT_PHASE_S = 300.0
DEFAULT_TIERS: dict[str, TierConfig] = {
    "interactive": TierConfig(priority=0, ttft_target_s=2.0, tpot_target_s=0.05),
    "batch": TierConfig(priority=10),
}
DEFAULT_TIER = "batch"


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    """How a trace runs on a fleet: the scenario (phases, tiers, workers) and each request's engine spec."""

    scenario: Scenario
    specs: tuple[RequestSpec, ...]
    """One per ``trace.requests``, in the same order."""
    trace: Trace
    profile_path: str
    unknown_hints: dict[str, int] = field(default_factory=dict)
    """Workload hints the profile has no acceptance class for → how many requests carried them."""
    class_source: dict[str, int] = field(default_factory=dict)
    """Acceptance class → how requests got it (hint, tenant map, default) with counts, for the report."""

    def load(self) -> TraceReplay:
        """A fresh arrival process for one run (it keeps per-session state)."""
        return TraceReplay(self.trace.requests, self.specs, end_s=self.scenario.duration_s)


def _tier_of(r: TraceRequest, tenants: TenantsConfig | None) -> str:
    if r.tier is not None:
        return r.tier
    tenant = tenants.tenant(r.tenant) if tenants is not None else None
    return tenant.tier if tenant is not None else DEFAULT_TIER


def plan_replay(
    trace: Trace,
    profile: Profile,
    *,
    profile_path: str,
    workers: int,
    tenants: TenantsConfig | None = None,
    class_map: Mapping[str, str] | None = None,
    phase_s: float = DEFAULT_PHASE_S,
    seed: int = 1,
    usd_per_gpu_hour: float = 3.0,
    name: str = "replay",
    max_num_seqs: int | None = None,
    window_s: float | None = None,
) -> ReplayPlan:
    """The scenario and request specs of ``trace`` on ``workers`` workers of ``profile`` (see the module
    docstring). ``profile_path`` is what the lab loads the profile from (a name or a file); ``max_num_seqs``
    defaults to the profile's recipe; ``window_s`` fixes the measured window (default: to 1 s after the last
    arrival)."""
    if not trace.requests:
        raise ConfigError(f"{trace.source}: the trace has no requests to replay")
    if phase_s <= 0:
        raise ConfigError(f"phase_s: must be > 0, got {phase_s}")
    tiers = dict(tenants.tiers) if tenants is not None else dict(DEFAULT_TIERS)
    class_map = dict(class_map or {})
    for tenant, cls in class_map.items():
        if cls not in profile.acceptance:
            raise ConfigError(f"class_map[{tenant}]: {cls!r} is not an acceptance class of {profile.name}")
    unknown: Counter[str] = Counter()
    source: Counter[str] = Counter()
    specs: list[RequestSpec] = []
    for r in trace.requests:
        tier = _tier_of(r, tenants)
        if tier not in tiers:
            raise ConfigError(
                f"{trace.source}: tier {tier!r} (tenant {r.tenant!r}) is not defined; known: {sorted(tiers)}; "
                "pass the gateway's tenants file with --tenants"
            )
        if r.workload is not None and r.workload in profile.acceptance:
            workload, how = r.workload, "hint"
        else:
            if r.workload is not None:
                unknown[r.workload] += 1
            if r.tenant in class_map:
                workload, how = class_map[r.tenant], "tenant map"
            else:
                workload, how = profile.default_workload, "default"
        source[f"{workload} ({how})"] += 1
        specs.append(
            RequestSpec(
                workload=workload,
                prompt_tokens=r.prompt_tokens,
                max_tokens=r.output_tokens,
                priority=tiers[tier].priority,
                tag=tier,
            )
        )
    scenario = Scenario(
        name=name,
        description=f"replay of {trace.source}",
        profile=profile_path,
        workers=workers,
        max_num_seqs=max_num_seqs or profile.serving.max_num_seqs,
        gpus_per_worker=profile.hardware.gpus,
        usd_per_gpu_hour=usd_per_gpu_hour,
        seed=seed,
        mixed=True,
        tiers=tiers,
        phases=_phases(trace, specs, phase_s, window_s or trace.duration_s + 1.0),
    )
    return ReplayPlan(
        scenario=scenario,
        specs=tuple(specs),
        trace=trace,
        profile_path=profile_path,
        unknown_hints=dict(unknown),
        class_source=dict(source),
    )


def _phases(trace: Trace, specs: list[RequestSpec], phase_s: float, end: float) -> tuple[ScenarioPhase, ...]:
    count = max(1, math.ceil(end / phase_s))
    buckets: list[list[tuple[TraceRequest, RequestSpec]]] = [[] for _ in range(count)]
    for r, spec in zip(trace.requests, specs, strict=True):
        if r.arrival_s < end:
            buckets[min(int(r.arrival_s // phase_s), count - 1)].append((r, spec))
    phases = []
    for i, bucket in enumerate(buckets):
        duration = min(phase_s, end - i * phase_s)
        phases.append(
            ScenarioPhase(
                name=f"w{i:03d}",
                duration_s=duration,
                arrival=Poisson(rate_per_s=max(len(bucket), 1) / duration),
                mix=_mix(bucket),
            )
        )
    return tuple(phases)


def _mix(bucket: list[tuple[TraceRequest, RequestSpec]]) -> tuple[TrafficClass, ...]:
    """The window's traffic classes (workload × tier) with their shares and mean lengths (exact: sigma 0)."""
    groups: dict[tuple[str, str], list[RequestSpec]] = {}
    for _, spec in bucket:
        groups.setdefault((spec.workload, spec.tag), []).append(spec)
    if not groups:
        return (TrafficClass(),)
    return tuple(
        TrafficClass(
            workload=workload,
            tier=tier,
            weight=len(group),
            prompt_tokens=Lengths(mean=sum(s.prompt_tokens for s in group) / len(group), sigma=0.0),
            output_tokens=Lengths(mean=sum(s.max_tokens for s in group) / len(group), sigma=0.0),
        )
        for (workload, tier), group in sorted(groups.items())
    )
