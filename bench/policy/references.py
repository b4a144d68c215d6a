"""The honest references (issue 25), composed in hindsight from the suite's measured runs, with restart costs.

A reference here is a *plan* over the scenario's phases: in each phase the fleet runs one of a set of measured
configurations, and it is credited that configuration's measured goodput in that phase (the same seeded trace
for every configuration, so the phases are comparable). A change between a configuration with the drafter
loaded and one without it (``no-drafter``) restarts every worker, one at a time: each worker serves nothing for
``restart_s``, so the fleet loses ``restart_s`` × the destination phase's goodput rate (tok/s; at most the
whole phase). The first phase starts in whatever mode it chooses, free. The best plan is found exactly by
dynamic programming over (phase, configuration).

- ``oracle``: per phase, the best of every static k, vLLM's tuned table and ``no-drafter``;
- ``best-fleet-plan``: the same over every configuration the hindsight searches measured besides those (the
  best static two-pool placement, ``bench.policy.placement``), so it is never below the oracle. It is a lower
  bound on the true ceiling: pools of mixed drafter mode and a per-phase placement search are not in it.

Each is computed at restart costs of ``RESTART_SCALES`` × the profile's ``serving.restart_s``.

A reference's goodput is *phase-tiled*: tokens within SLA delivered in each phase over the phases' whole
duration (``PhaseMetrics``; the warm-up is inside the first phase), so a run is compared with a reference on
the same footing by ``tiled_goodput`` (a run's own ``goodput_tok_s`` leaves the warm-up out).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.policy.run_metrics import RunMetrics

RESTART_SCALES: tuple[float, ...] = (0.25, 1.0, 3.0)
DRAFTER_FREE = frozenset({"no-drafter"})
"""Configurations whose workers run without their drafter (a switch to or from them is a restart)."""


@dataclass(frozen=True)
class Reference:
    """A hindsight plan over the phases and its credited goodput."""

    name: str
    restart_s: float
    goodput_tok_s: float
    choice: tuple[tuple[str, str], ...]
    """(phase, configuration) in scenario order."""
    restart_tokens: float
    """Tokens lost to restarts in the plan."""
    phase_goodput: Mapping[str, float]
    """Phase → credited goodput in it, tok/s (restart losses included)."""

    def describe(self) -> str:
        return ", ".join(f"{phase}: {cfg}" for phase, cfg in self.choice)


def tiled_goodput(m: RunMetrics) -> float:
    """A run's goodput over its phases' whole duration, tok/s (the references' footing)."""
    total = sum(p.duration_s for p in m.phases)
    return sum(p.goodput_tok_s * p.duration_s for p in m.phases) / total if total > 0 else 0.0


def _phase_goodput(m: RunMetrics) -> dict[str, tuple[float, float]]:
    return {p.name: (p.goodput_tok_s, p.duration_s) for p in m.phases}


def best_plan(name: str, runs: Sequence[RunMetrics], *, restart_s: float) -> Reference:
    """The best per-phase plan over ``runs`` (all of one scenario, same phases), restarts charged."""
    if not runs:
        raise ValueError(f"{name}: no configuration to plan over")
    tables = {m.policy: _phase_goodput(m) for m in runs}
    phases = [p.name for p in runs[0].phases]
    # value[cfg] = (tokens so far, restart tokens so far, path)
    value: dict[str, tuple[float, float, tuple[str, ...]]] = {}
    for i, phase in enumerate(phases):
        step: dict[str, tuple[float, float, tuple[str, ...]]] = {}
        for cfg, table in tables.items():
            rate, duration = table[phase]
            tokens = rate * duration
            if i == 0:
                step[cfg] = (tokens, 0.0, (cfg,))
                continue
            best: tuple[float, float, tuple[str, ...]] | None = None
            for prev, (got, lost, path) in value.items():
                restart = (prev in DRAFTER_FREE) != (cfg in DRAFTER_FREE)
                loss = min(restart_s * rate, tokens) if restart else 0.0
                cand = (got + tokens - loss, lost + loss, (*path, cfg))
                if best is None or cand[0] > best[0] + 1e-9:
                    best = cand
            assert best is not None
            step[cfg] = best
        value = step
    total, lost, path = max(value.values(), key=lambda v: v[0])
    durations = [tables[path[0]][p][1] for p in phases]
    window = sum(durations)
    credited = _credited(tables, phases, path, restart_s)
    return Reference(
        name=name,
        restart_s=restart_s,
        goodput_tok_s=total / window if window > 0 else 0.0,
        choice=tuple(zip(phases, path, strict=True)),
        restart_tokens=lost,
        phase_goodput=credited,
    )


def _credited(tables: Mapping[str, Mapping[str, tuple[float, float]]], phases: Sequence[str],
              path: Sequence[str], restart_s: float) -> dict[str, float]:  # fmt: skip
    out: dict[str, float] = {}
    for i, (phase, cfg) in enumerate(zip(phases, path, strict=True)):
        rate, duration = tables[cfg][phase]
        restart = i > 0 and (path[i - 1] in DRAFTER_FREE) != (cfg in DRAFTER_FREE)
        loss = min(restart_s * rate, rate * duration) if restart else 0.0
        out[phase] = (rate * duration - loss) / duration if duration > 0 else 0.0
    return out
