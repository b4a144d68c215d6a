"""Usage reports from the store's ledger (for ``/v1/usage`` and the admin API)."""

from __future__ import annotations

from typing import Any

from gateway.core import Gateway
from gateway.errors import InvalidRequest

DEFAULT_RANGE_S = 24 * 3600.0


async def usage_report(
    gw: Gateway, tenant: str, *, since: float | None, until: float | None, limit: int
) -> dict[str, Any]:
    """Totals and the first ``limit`` records (time order) of ``tenant`` with ``since <= at < until`` (Unix s)."""
    end = until if until is not None else gw.clock.wall() + 1e-6
    start = since if since is not None else end - DEFAULT_RANGE_S
    if start > end:
        raise InvalidRequest(f"since ({start}) is after until ({end}).", param="since")
    totals = await gw.store.usage(tenant, since=start, until=end, limit=limit)
    records = list(totals.records)
    return {
        "object": "usage",
        "tenant": tenant,
        "since": start,
        "until": end,
        "requests": totals.requests,
        "prompt_tokens": totals.prompt_tokens,
        "completion_tokens": totals.completion_tokens,
        "total_tokens": totals.prompt_tokens + totals.completion_tokens,
        "cost_usd": totals.cost_usd,
        "data": [r.model_dump() for r in records],
    }
