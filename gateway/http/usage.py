"""Usage reports from the store's ledger (for ``/v1/usage`` and the admin API)."""

from __future__ import annotations

from typing import Any

from gateway.errors import InvalidRequest
from gateway.wiring import Gateway

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


async def ledger_page(gw: Gateway, *, since: float, until: float | None, limit: int) -> dict[str, Any]:
    """Fleet-wide: the first ``limit`` ledger records with ``since <= at < until`` (Unix s) in time order, and
    where the next page starts (``next_since``, None on the last page). A page may repeat records whose ``at``
    equals its ``since``: readers drop repeated request ids (``gearshift usage export`` does)."""
    end = until if until is not None else gw.clock.wall() + 1e-6
    if since > end:
        raise InvalidRequest(f"since ({since}) is after until ({end}).", param="since")
    records = await gw.store.ledger(since=since, until=end, limit=limit)
    full = limit > 0 and len(records) == limit
    return {
        "object": "list",
        "since": since,
        "until": end,
        "data": [r.model_dump() for r in records],
        "next_since": records[-1].at if full else None,
    }
