"""Fit the step-time parameters of a ``fleet.perf.Profile`` to measured points.

In memory-bound decode (the regime of every (B, k) a controller chooses between) ``fleet.perf.step_time`` is
linear in seven time coefficients once the model's structure is fixed. With n = B·(k + 1) verified tokens,
C the batch's context tokens and [k>0] the drafter's indicator, the step time in seconds is

    T = c_fixed + c_expert · experts_touched(n) + c_token · n + c_context · C
        + [k>0] · (d_fixed + d_seq · B) + d_position · B · k

with c_fixed = step_overhead_s + dense_bytes / bw, c_expert = expert_bytes / bw, c_token =
comm_s_per_token (+ sample_s_per_token, which decode cannot tell apart), c_context = kv_bytes_per_token ·
kv_read_replicas / bw and the drafter's fixed_s, per_seq_s and per_position_s. The structure (experts,
routing, replicas, bandwidth, FLOP rates) comes from a base profile; the fit solves the coefficients by
non-negative least squares on relative error and writes them back as profile fields.

The swept worker runs with its drafter loaded (it serves k > 0), so its k = 0 steps pay the base profile's
idle-drafter tax (``fleet.perf.IdleDrafterTax``, a share of the target's time rising with batch). The fit divides
that share out of the k = 0 points, and the fitted profile keeps the base's tax.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bench.profiler.sweep import Point
from fleet.perf import AcceptanceClass, Profile, StepShape, experts_touched, step_time

COEFFICIENTS = ("c_fixed", "c_expert", "c_token", "c_context", "d_fixed", "d_seq", "d_position")
_TINY = 1e-12


@dataclass(frozen=True, slots=True)
class Fit:
    profile: Profile
    coefficients: dict[str, float]
    """Seconds per unit of each regressor (see the module docstring)."""
    points: tuple[Point, ...]

    def predicted_s(self, point: Point) -> float:
        """The fitted profile's step time at the point's measured shape, seconds."""
        return step_time(self.profile, shape_of(point)).total_s

    def max_relative_error(self) -> float:
        return max(abs(self.predicted_s(p) / p.step_s - 1.0) for p in self.points)


def shape_of(point: Point) -> StepShape:
    """The decode-only step a point measured (B sequences at k, their summed context, drafter loaded)."""
    return StepShape(
        decode_seqs=point.batch_size,
        k=point.k,
        context_tokens=round(point.context_tokens * point.batch_size),
        drafter_loaded=True,
    )


def idle_tax_factor(base: Profile, point: Point) -> float:
    """How much longer than the target's own time a k = 0 step of the point's batch ran (1 + the base's
    idle-drafter share; 1 for k > 0 or a profile without the tax)."""
    tax = base.drafter.k0_tax
    return 1.0 + tax.fraction(point.batch_size) if point.k == 0 and tax is not None else 1.0


def regressors(base: Profile, batch: int, k: int, context_tokens: float) -> list[float]:
    """One row of the design matrix (order of ``COEFFICIENTS``)."""
    n = batch * (k + 1)
    on = 1.0 if k > 0 else 0.0
    return [1.0, experts_touched(base, n), float(n), context_tokens, on, on * batch, float(batch * k)]


def nonnegative_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient ≥ 0: refit without the most negative column until none is
    negative (an active-set scheme; exact for the few, well-separated columns used here)."""
    active = list(range(a.shape[1]))
    while True:
        coef = np.zeros(a.shape[1])
        if active:
            solution, *_ = np.linalg.lstsq(a[:, active], y, rcond=None)
            coef[active] = solution
        negative = [i for i in active if coef[i] < 0]
        if not negative:
            return coef
        active.remove(min(negative, key=lambda i: coef[i]))


def fit_step_time(base: Profile, points: Sequence[Point]) -> dict[str, float]:
    """Solve the coefficients minimising Σ ((T_model − T_measured) / T_measured)²."""
    if len(points) < len(COEFFICIENTS):
        raise ValueError(f"points: need at least {len(COEFFICIENTS)} measured points, got {len(points)}")
    a = np.array([regressors(base, p.batch_size, p.k, p.context_tokens * p.batch_size) for p in points])
    y = np.array([p.step_s / idle_tax_factor(base, p) for p in points])
    scale = 1.0 / y
    coef = nonnegative_lstsq(a * scale[:, None], y * scale)
    return dict(zip(COEFFICIENTS, (float(c) for c in coef), strict=True))


def measured_acceptance(points: Sequence[Point]) -> AcceptanceClass | None:
    """Conditional per-position acceptance P(i accepted | 0…i−1 accepted) from the points at the largest k
    that drafted; None when nothing was drafted."""
    drafting = [p for p in points if p.k > 0 and p.window.drafts > 0]
    if not drafting:
        return None
    k = max(p.k for p in drafting)
    drafts = sum(p.window.drafts for p in drafting if p.k == k)
    per_pos = [0.0] * k
    for p in drafting:
        if p.k == k:
            for i, v in enumerate(p.window.accepted_per_pos[:k]):
                per_pos[i] += v
    rates = [v / drafts for v in per_pos]
    conditional = [rates[0]] + [r / prev if prev > 0 else 0.0 for prev, r in itertools.pairwise(rates)]
    return AcceptanceClass(base=tuple(round(min(max(c, 0.0), 1.0), 4) for c in conditional))


def fitted_profile(
    base: Profile,
    points: Sequence[Point],
    *,
    name: str,
    k_max: int,
    workload: str = "measured",
    description: str = "",
) -> Fit:
    """The base profile with its step-time parameters, drafter and acceptance replaced by the measured ones."""
    c = fit_step_time(base, points)
    bw = base.hardware.hbm_bytes_per_s
    overhead = c["c_fixed"] - base.target.dense_bytes / bw
    dense = base.target.dense_bytes if overhead >= 0 else max(c["c_fixed"] * bw, _TINY)
    target = base.target.model_copy(
        update={
            "step_overhead_s": max(overhead, 0.0),
            "dense_bytes": dense,
            "expert_bytes": max(c["c_expert"] * bw, _TINY),
            "comm_s_per_token": c["c_token"],
            "sample_s_per_token": 0.0,
            "verify_s_per_token": 0.0,
            "state_bytes_per_seq": 0.0,
            "kv_bytes_per_token": max(c["c_context"] * bw / base.target.kv_read_replicas, _TINY),
        }
    )
    drafter = base.drafter.model_copy(
        update={"k_max": k_max, "fixed_s": c["d_fixed"], "per_seq_s": c["d_seq"], "per_position_s": c["d_position"]}
    )
    acceptance = measured_acceptance(points)
    classes = {workload: acceptance} if acceptance is not None else dict(base.acceptance)
    profile = base.model_copy(
        update={
            "name": name,
            "description": description or base.description,
            "target": target,
            "drafter": drafter,
            "acceptance": classes,
            "default_workload": workload if acceptance is not None else base.default_workload,
        }
    )
    # Re-validate: model_copy skips validation, the written file must load with load_profile.
    profile = Profile.model_validate(profile.model_dump())
    return Fit(profile=profile, coefficients=c, points=tuple(points))
