"""The picker: order the scored candidates best first (the first is used, the rest are the retry order)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from gateway.routing.pool import WorkerView


def rank(
    candidates: Sequence[WorkerView], totals: Sequence[float], rng: random.Random
) -> tuple[list[WorkerView], dict[str, float]]:
    """Candidates by total score, best first, and each one's total. Ties go to the worker with fewer of this
    gateway's requests, then to a random one (spreads a cold start)."""
    keys = {w.id: (totals[i], -w.in_flight, rng.random()) for i, w in enumerate(candidates)}
    ranked = sorted(candidates, key=lambda w: keys[w.id], reverse=True)
    return ranked, {w.id: keys[w.id][0] for w in candidates}
