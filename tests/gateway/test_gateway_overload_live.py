"""Overload control through a real gateway on loopback: more load than the fake worker serves sheds the
sheddable tier first, every request gets one answer, and every answered request is metered exactly once;
the brownout switch of the admin API caps ``max_tokens``."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import httpx

from fleet.config import FleetConfig, TenantsConfig, key_digest
from fleet.store.protocol import SlotLimit
from gateway.intake.overload import SHED_REASONS

from .harness import KEYS, MODEL, PEPPER, StartUpstreams, eventually, serve_gateway

REQUESTS_PER_TIER = 16


def one_small_worker(url: str) -> FleetConfig:
    """One worker with two batch slots: with 0.2 s streams it serves about 10 requests per second."""
    return FleetConfig.model_validate(
        {"models": [{"name": MODEL}], "workers": [{"id": "w0", "url": url, "model": MODEL, "max_num_seqs": 2}]}
    )


def tiered_tenants() -> TenantsConfig:
    """alpha: interactive (priority 0, waits up to 20 s); beta: batch (priority 10, sheddable, TTFT target
    0.3 s, brownout cap 3 tokens)."""
    return TenantsConfig.model_validate(
        {
            "tiers": {
                "interactive": {"priority": 0, "ttft_target_s": 20.0},
                "batch": {"priority": 10, "ttft_target_s": 0.3, "sheddable": True, "brownout_max_tokens": 3},
            },
            "tenants": [
                {
                    "id": tid,
                    "tier": tier,
                    "max_concurrency": 64,
                    "keys": [{"id": f"{tid}-1", "digest": key_digest(KEYS[tid], pepper=PEPPER)}],
                }
                for tid, tier in (("alpha", "interactive"), ("beta", "batch"))
            ],
        }
    )


def body(max_tokens: int = 4) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "stream": True}


async def test_overload_sheds_the_sheddable_tier_first_and_loses_or_double_meters_nothing(
    upstreams: StartUpstreams,
) -> None:
    (w,) = await upstreams(1, chunks=4, delay_s=0.05)
    async with serve_gateway(one_small_worker(w.url), tiered_tenants(), request_timeout_s=30) as g:
        async with g.client("alpha", timeout=30) as alpha, g.client("beta", timeout=30) as beta:
            calls = [
                c.post("/v1/chat/completions", json=body()) for _ in range(REQUESTS_PER_TIER) for c in (beta, alpha)
            ]
            answers: list[httpx.Response] = await asyncio.gather(*calls)
        by_tier = {
            tier: Counter(r.status_code for r in answers[i::2]) for i, tier in enumerate(("batch", "interactive"))
        }
        assert by_tier["interactive"] == {200: REQUESTS_PER_TIER}  # nothing of the interactive tier is shed
        assert by_tier["batch"][429] >= REQUESTS_PER_TIER // 2, by_tier
        assert set(by_tier["batch"]) <= {200, 429}
        for r in answers:
            if r.status_code == 429:
                assert r.headers["x-gearshift-limit"] == "overload"
                assert int(r.headers["retry-after"]) >= 1
                assert r.json()["error"]["type"] == "rate_limit_error"
        answered = {r.headers["x-request-id"] for r in answers if r.status_code == 200}
        assert len(answered) == sum(r.status_code == 200 for r in answers)
        assert len(w.bodies) == len(answered)  # a refused request never reached the worker

        async def ledger_complete() -> bool:
            return len(await g.store.ledger(since=0.0, until=1e12)) >= len(answered)

        await eventually(ledger_complete, timeout_s=10.0)
        records = await g.store.ledger(since=0.0, until=1e12)
        assert Counter(r.request_id for r in records) == Counter(answered)  # each answered request metered once
        assert {r.status for r in records} == {"ok"}
        shed = g.gw.metrics.registry.get_sample_value
        total_shed = sum(
            shed("gearshift_gateway_shed_requests_total", {"tier": "batch", "reason": reason}) or 0.0
            for reason in SHED_REASONS
        )
        assert total_shed == by_tier["batch"][429]
        assert shed("gearshift_gateway_queued_seconds_count", {"tier": "interactive"})
        assert g.gw.overload.depth(MODEL) == 0
        assert g.gw.pool.views["w0"].in_flight == 0
        for tenant in ("alpha", "beta"):  # every concurrency slot came back: a limit of one admits again
            probe = SlotLimit(key=f"concurrency:{tenant}", slot_id="probe", limit=1)
            assert (await g.store.admit([probe], now=time.time())).allowed


async def test_the_brownout_switch_caps_max_tokens_per_tier(upstreams: StartUpstreams) -> None:
    (w,) = await upstreams(1)
    async with (
        serve_gateway(one_small_worker(w.url), tiered_tenants()) as g,
        g.admin() as admin,
        g.client("beta") as beta,
        g.client("alpha") as alpha,
    ):
        assert (await admin.get("/admin/v1/brownout")).json() == {"mode": "auto", "active": False, "auto_on": False}
        assert (await beta.put("/admin/v1/brownout", json={"mode": "on"})).status_code == 401
        assert (await admin.put("/admin/v1/brownout", json={"mode": "dim"})).status_code == 400
        switched = await admin.put("/admin/v1/brownout", json={"mode": "on"})
        assert switched.json() == {"mode": "on", "active": True, "auto_on": False}
        assert (await beta.post("/v1/chat/completions", json=body(100))).status_code == 200
        assert w.bodies[-1]["max_tokens"] == 3  # the batch tier's cap
        assert (await alpha.post("/v1/chat/completions", json=body(100))).status_code == 200
        assert w.bodies[-1]["max_tokens"] == 100  # the interactive tier has none
        await admin.put("/admin/v1/brownout", json={"mode": "off"})
        assert (await beta.post("/v1/chat/completions", json=body(100))).status_code == 200
        assert w.bodies[-1]["max_tokens"] == 100
