"""Acceptance for traced requests without a workload hint, from what the controller measured (``--acceptance-from-
store``): each tenant runs as the profile's acceptance class whose predicted accepted length at the measured k is
closest to the accepted length the controller published for the workers that served that tenant (weighted by how
many of the tenant's requests each served). Tenants whose workers published nothing keep the default."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping

from bench.replay.trace import Trace
from fleet.config import CommonSettings
from fleet.perf import Profile, conditional_acceptance, expected_tokens_per_step
from fleet.store.factory import build_store
from fleet.store.protocol import WorkerState


def closest_class(profile: Profile, accepted_length: float, k: int, context_tokens: float) -> str:
    """The acceptance class whose expected tokens per step at ``k`` is nearest ``accepted_length``."""

    def gap(name: str) -> float:
        return abs(expected_tokens_per_step(conditional_acceptance(profile, name, context_tokens), k) - accepted_length)

    return min(sorted(profile.acceptance), key=gap)


def tenant_classes(trace: Trace, states: Mapping[str, WorkerState], profile: Profile) -> dict[str, str]:
    """Tenant → acceptance class from the published states of the workers that served it (see the module)."""
    served: dict[str, Counter[str]] = {}
    prompt: dict[str, list[int]] = {}
    for r in trace.requests:
        if r.worker_id is not None and r.worker_id in states and states[r.worker_id].k_applied > 0:
            served.setdefault(r.tenant, Counter())[r.worker_id] += 1
            prompt.setdefault(r.tenant, []).append(r.prompt_tokens)
    out: dict[str, str] = {}
    for tenant, counts in served.items():
        total = sum(counts.values())
        length = sum(states[w].accepted_length * n for w, n in counts.items()) / total
        k = round(sum(states[w].k_applied * n for w, n in counts.items()) / total)
        context = sum(prompt[tenant]) / len(prompt[tenant])
        out[tenant] = closest_class(profile, length, max(k, 1), context)
    return out


def class_map_from_store(redis_url: str, trace: Trace, profile: Profile) -> dict[str, str]:
    """``tenant_classes`` on the worker states published in the store at ``redis_url``."""

    async def read() -> dict[str, WorkerState]:
        store = build_store(CommonSettings(redis_url=redis_url))
        try:
            return await store.worker_states()
        finally:
            await store.close()

    return tenant_classes(trace, asyncio.run(read()), profile)
