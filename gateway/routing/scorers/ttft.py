"""The TTFT scorer: prefer the worker predicted to start this request's answer soonest."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fleet.config import FleetConfig
from fleet.perf import Profile, StepShape, step_time, worker_profiles
from gateway.routing.context import RouteContext
from gateway.routing.pool import WorkerView


def profile_prefill_rate(profile: Profile) -> float:
    """Prompt tokens per second a worker prefills with nothing else in the step: one chunked-prefill step of
    ``chunked_prefill_tokens`` over its predicted step time (``fleet.perf.step_time``, no speculation)."""
    chunk = profile.chunked_prefill_tokens
    return chunk / step_time(profile, StepShape(decode_seqs=0, k=0, context_tokens=0, prefill_tokens=chunk)).total_s


def prefill_rates(fleet: FleetConfig, *, override: float | None = None) -> dict[str, float]:
    """Worker id → prefill rate (tokens per second): ``override`` when set, else from its model's profile."""
    if override is not None:
        return {w.id: override for w in fleet.workers}
    by_profile: dict[int, float] = {}
    rates = {}
    for worker_id, profile in worker_profiles(fleet).items():
        if id(profile) not in by_profile:
            by_profile[id(profile)] = profile_prefill_rate(profile)
        rates[worker_id] = by_profile[id(profile)]
    return rates


class TtftScorer:
    """``1 / (1 + predicted_ttft / target)`` with ``predicted_ttft = (prefill_tokens + prompt_tokens) / rate``
    (seconds): the prompt tokens this gateway has outstanding on the worker (not yet answered with a first byte)
    plus this request's, over the worker's prefill rate (tokens per second, ``rates``: from its profile or the
    settings), and ``target`` the tier's ``ttft_target_s`` (else ``reference_s``). A worker with nothing to
    prefill scores ``1 / (1 + prompt / (rate · target))``; one predicted to take the whole target scores 0.5."""

    name = "ttft"

    def __init__(self, *, rates: Mapping[str, float], reference_s: float) -> None:
        if reference_s <= 0 or any(r <= 0 for r in rates.values()):
            raise ValueError("prefill rates and reference_s must be positive")
        self._rates = dict(rates)
        self._reference_s = reference_s

    def predicted_ttft(self, ctx: RouteContext, worker: WorkerView) -> float:
        """Seconds until ``worker`` would have prefilled this request after the work queued before it."""
        return (worker.prefill_tokens + ctx.prompt_tokens) / self._rates[worker.id]

    async def __call__(self, ctx: RouteContext, workers: Sequence[WorkerView]) -> list[float]:
        target = ctx.tier.ttft_target_s or self._reference_s
        return [1.0 / (1.0 + self.predicted_ttft(ctx, w) / target) for w in workers]
