"""Limits exact at scale: two ``gearshift gateway`` processes on one store (a single Redis, then a 3-master Redis
Cluster), driven concurrently, each tenant with one limit; for each limit, what was admitted against the limit.

- **RPM**: ``2 × rpm`` short streams in well under a minute, alternating between the replicas; admitted counts the
  200s (target: within ±1 % of the limit, as the 100-bucket rolling window allows).
- **TPM**: streams of ``max_tokens`` tokens until refused; used is the ledger's prompt + completion tokens (target:
  never above the limit by more than what was reserved but not yet settled for the requests in flight; admission
  reserves the prompt estimate + ``max_tokens`` up front, so the overshoot can only come from a prompt whose real
  count exceeds the gateway's estimate, at most ``in flight × that excess``).
- **Concurrency**: many looping clients; from the ledger, the most requests whose ``[admitted, finish]`` overlap
  (the requests in progress at once: from the moment admission granted the request to its finish, when its slot
  is released; shown beside the overlap of ``[arrival, finish]``, which adds each request's time before and in
  admission, and so also counts requests that were still waiting for the store's answer while another finished).
  Target: never above the limit.
- **Budget**: requests until refused; spent is the store's spend counter (billed with the ledger records) against
  the budget; bound: the requests in flight when the budget was reached, each at most the largest request cost.

Two experiments per store. **exact**: the limits are small, so no quota lease applies (a lease under 2 units is not
taken) and every request asks the store. **leased**: larger limits and ``GEARSHIFT_LEASE_FRACTION`` raised so that
each replica serves RPM, TPM and the budget from quota leases (``gateway.intake.leases``); the stated bound adds the
outstanding leases, ``lease_max_outstanding × lease_fraction`` of the limit (RPM and TPM, either way: leased units
unused at the end count in the window too), and for the budget the spend that other replicas' leases may not have
seen, at most the fleet's spend within one ``lease_ttl_s`` (measured from the ledger). Concurrency is never leased:
exact in both.

Workers are simulated (``gearshift sim serve``) at a speed-up that makes a request last tens of milliseconds.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import yaml

from bench.markdown import table
from bench.procs import Proc, start_gateway, start_redis, start_redis_cluster, start_sim
from bench.soak.client import StreamResult, stream_chat
from fleet.config import FleetConfig, TenantsConfig, key_digest
from fleet.store.protocol import UsageRecord
from fleet.store.redis import RedisStore
from gateway.settings import GatewaySettings
from gateway.upstream.body import BodyRules, parse_completion

MODEL = "kimi-k3"
PEPPER = "limits-bench-pepper"
RUN_S = 50.0
"""Each experiment ends within this many seconds of its start, inside one 60 s window."""


@dataclass(frozen=True)
class LimitsBenchConfig:
    rpm: int = 300
    tpm: int = 20_000
    max_concurrency: int = 8
    budget_usd: float = 0.05
    clients: int = 32
    """Concurrent clients of every experiment."""
    concurrency_s: float = 6.0
    """How long the concurrency clients loop, seconds."""
    speedup: float = 20.0
    stores: tuple[str, ...] = ("redis", "cluster")
    experiments: tuple[str, ...] = ("exact", "leased")
    leased_rpm: int = 1_000
    leased_tpm: int = 40_000
    leased_budget_usd: float = 0.05
    lease_fraction: float = 0.02
    """``GEARSHIFT_LEASE_FRACTION`` of the leased experiment: with 2 replicas a lease is 1 % of a limit (10 requests
    of the leased RPM, 400 tokens of its TPM)."""
    lease_max_outstanding: int = 2
    lease_ttl_s: float = 2.0

    def limits(self, experiment: str) -> tuple[int, int, float]:
        """RPM, TPM and budget (USD) of ``experiment``."""
        if experiment == "leased":
            return self.leased_rpm, self.leased_tpm, self.leased_budget_usd
        return self.rpm, self.tpm, self.budget_usd

    def lease_bound(self, experiment: str, limit: float) -> float:
        """Units above (or below) ``limit`` the outstanding leases may admit in ``experiment``."""
        return self.lease_max_outstanding * self.lease_fraction * limit if experiment == "leased" else 0.0


@dataclass
class LimitResult:
    store: str
    limit: str
    configured: float
    admitted: float
    bound: float
    """How far above ``configured`` ``admitted`` may be without missing the target (0 for RPM and concurrency)."""
    detail: str = ""
    refused: int = 0
    experiment: str = "exact"

    @property
    def met(self) -> bool:
        if self.limit == "rpm":  # the rolling window's 1 % buckets, plus what leases outstanding may shift
            return abs(self.admitted - self.configured) <= 0.01 * self.configured + self.bound
        return self.admitted <= self.configured + self.bound


@dataclass
class LimitsBenchResult:
    results: list[LimitResult] = field(default_factory=list)


TENANTS = ("rpm", "tpm", "conc", "budget")


def _key(tenant: str) -> str:
    return f"sk-limits-{tenant}-0000"


def _tenants(config: LimitsBenchConfig, experiment: str) -> TenantsConfig:
    rpm, tpm, budget = config.limits(experiment)
    limits: dict[str, dict[str, float]] = {
        "rpm": {"rpm": rpm},
        "tpm": {"tpm": tpm},
        "conc": {"max_concurrency": config.max_concurrency},
        "budget": {"budget_usd": budget},
    }
    if experiment == "leased":  # the slot admit still asks the store while leases serve the request's other limits
        limits["conc"] |= {"rpm": 1_000_000, "tpm": 1_000_000_000}
    return TenantsConfig.model_validate(
        {
            "tiers": {"standard": {"priority": 0}},
            "tenants": [
                {
                    "id": t,
                    "tier": "standard",
                    **limits[t],
                    "keys": [{"id": f"{t}-1", "digest": key_digest(_key(t), pepper=PEPPER)}],
                }
                for t in TENANTS
            ],
        }
    )


def _fleet(urls: Sequence[str]) -> FleetConfig:
    return FleetConfig.model_validate(
        {
            "models": [{"name": MODEL}],
            "workers": [{"id": f"w{i}", "url": u, "model": MODEL} for i, u in enumerate(urls)],
        }
    )


def _env(
    work: Path, config: LimitsBenchConfig, urls: Sequence[str], *, redis_url: str, cluster: bool, experiment: str
) -> dict[str, str]:
    fleet_file, tenants_file = work / "fleet.yaml", work / f"tenants-{experiment}.yaml"
    fleet_file.write_text(yaml.safe_dump(_fleet(urls).model_dump(mode="json")))
    tenants_file.write_text(yaml.safe_dump(_tenants(config, experiment).model_dump(mode="json")))
    leases = (
        {"GEARSHIFT_LEASE_FRACTION": str(config.lease_fraction),
         "GEARSHIFT_LEASE_MAX_OUTSTANDING": str(config.lease_max_outstanding),
         "GEARSHIFT_LEASE_TTL_S": str(config.lease_ttl_s)}
        if experiment == "leased" else {}
    )  # fmt: skip
    return leases | {
        "GEARSHIFT_FLEET_FILE": str(fleet_file),
        "GEARSHIFT_TENANTS_FILE": str(tenants_file),
        "GEARSHIFT_KEY_PEPPER": PEPPER,
        "GEARSHIFT_ADMIN_KEY": "limits-bench-admin-key",
        "GEARSHIFT_CONTROL_TOKEN": "limits-bench-control-token",
        "GEARSHIFT_REDIS_URL": redis_url,
        "GEARSHIFT_REDIS_CLUSTER": "true" if cluster else "false",
        "GEARSHIFT_KEY_PREFIX": f"limits-{uuid.uuid4().hex[:8]}:",
        "GEARSHIFT_CONCURRENCY_GRACE_S": "0",  # no retry wait: a request's [arrival, finish] stays tight
        "GEARSHIFT_LOG_LEVEL": "WARNING",
        "GEARSHIFT_HEALTH_INTERVAL_S": "30",
    }


def _chat(max_tokens: int) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens}


async def _fire(
    urls: Sequence[str], tenant: str, *, n: int, clients: int, max_tokens: int, until: Callable[[], bool]
) -> list[StreamResult]:
    """Up to ``n`` streams by ``clients`` looping clients, alternating between ``urls``, until ``until()``."""
    results: list[StreamResult] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RUN_S
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def client(i: int) -> None:
            while len(results) < n and not until() and loop.time() < deadline:
                url = urls[(len(results) + i) % len(urls)]
                r = await stream_chat(s, url, key=_key(tenant), body=_chat(max_tokens), timeout_s=30)
                results.append(r)
                if not r.ok:
                    await asyncio.sleep(0.01)

        await asyncio.gather(*(client(i) for i in range(clients)))
    return results


def max_overlap(intervals: Sequence[tuple[float, float]]) -> int:
    """The most intervals ``(start, end)`` open at one instant (an end before a start at the same time)."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda e: (e[0], e[1]))
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


async def _records(store: RedisStore, tenant: str) -> list[UsageRecord]:
    return list((await store.usage(tenant, since=0, until=math.inf, limit=100_000)).records)


def max_spend_within(records: Sequence[UsageRecord], span_s: float) -> float:
    """The most USD the ``records`` billed within any ``span_s`` seconds (by their ``at``)."""
    recs = sorted(records, key=lambda r: r.at)
    best = total = 0.0
    start = 0
    for r in recs:
        total += r.cost_usd
        while r.at - recs[start].at > span_s:
            total -= recs[start].cost_usd
            start += 1
        best = max(best, total)
    return best


async def _measure(
    store_name: str, urls: Sequence[str], store: RedisStore, config: LimitsBenchConfig, experiment: str = "exact"
) -> list[LimitResult]:
    out: list[LimitResult] = []
    c = config.clients
    rpm_limit, tpm_limit, budget_limit = config.limits(experiment)

    def result(limit: str, configured: float, admitted: float, bound: float, detail: str, refused: int) -> None:
        out.append(LimitResult(store_name, limit, configured, admitted, bound, detail, refused, experiment))

    rpm = await _fire(urls, "rpm", n=2 * rpm_limit, clients=c, max_tokens=2, until=lambda: False)
    admitted = sum(r.ok for r in rpm)
    lease = config.lease_bound(experiment, rpm_limit)
    result("rpm", rpm_limit, admitted, lease, f"{len(rpm)} sent" + (f"; leases ±{lease:g}" if lease else ""),
           len(rpm) - admitted)  # fmt: skip

    tpm = await _fire(urls, "tpm", n=10_000, clients=c, max_tokens=100, until=lambda: False)
    tpm_refused = sum(not r.ok for r in tpm)
    await asyncio.sleep(1.0)  # the background ledger writers
    recs = await _records(store, "tpm")
    used = sum(r.prompt_tokens + r.completion_tokens for r in recs)
    excess = max([0, *(r.prompt_tokens - _estimate_prompt() for r in recs)])
    lease = config.lease_bound(experiment, tpm_limit)
    detail = f"{len(recs)} served; real prompt ≤ estimate + {excess} tokens" + (f"; leases {lease:g}" if lease else "")
    result("tpm", tpm_limit, used, float(c * excess) + lease, detail, tpm_refused)

    loop = asyncio.get_running_loop()
    stop_at = loop.time() + config.concurrency_s
    conc = await _fire(urls, "conc", n=100_000, clients=c, max_tokens=64, until=lambda: loop.time() > stop_at)
    await asyncio.sleep(1.0)
    recs = await _records(store, "conc")
    held = max_overlap([(r.admitted_at or r.at, r.at) for r in recs])
    lower = max_overlap([(r.arrived_at + r.ttft_s, r.at) for r in recs if r.arrived_at and r.ttft_s is not None])
    upper = max_overlap([(r.arrived_at or r.at, r.at) for r in recs])
    detail = f"{len(recs)} served; overlap of [first token, finish] {lower}, of [arrival, finish] {upper}"
    refused = sum(not r.ok for r in conc)
    result("concurrency", config.max_concurrency, held, 0.0, detail, refused)

    budget = await _fire(urls, "budget", n=10_000, clients=c, max_tokens=32, until=lambda: False)
    await asyncio.sleep(1.0)
    recs = await _records(store, "budget")
    spent = await store.spent("spend:budget")
    biggest = max([0.0, *(r.cost_usd for r in recs)])
    detail = f"{len(recs)} served; largest request {biggest:.2e} USD"
    unseen = max_spend_within(recs, config.lease_ttl_s) if experiment == "leased" else 0.0
    if unseen:
        detail += f"; most spent within {config.lease_ttl_s:g} s {unseen:.2e} USD"
    result("budget", budget_limit, spent, c * biggest + unseen, detail, sum(not r.ok for r in budget))
    return out


def _estimate_prompt() -> int:
    """The gateway's prompt estimate of the bench's one message (``gateway.upstream.body``'s rule, default settings)."""
    rules = BodyRules.from_settings(GatewaySettings())
    return parse_completion(orjson.dumps(_chat(1)), prompt_field="messages", rules=rules).prompt_tokens


async def run(config: LimitsBenchConfig, work: Path) -> LimitsBenchResult:
    """Every store of ``config.stores``: start it, two workers and two gateways; measure; stop them."""
    result = LimitsBenchResult()
    with ExitStack() as stack:
        sims = [start_sim(f"limits-w{i}", log_dir=work, speedup=config.speedup, seed=i) for i in range(2)]
        for sim in sims:
            stack.callback(sim.stop)
        for name in config.stores:
            store_dir = work / name
            store_dir.mkdir(parents=True, exist_ok=True)
            with ExitStack() as per_store:
                if name == "cluster":
                    cluster = start_redis_cluster(log_dir=store_dir)
                    per_store.callback(cluster.stop)
                    url = cluster.url
                else:
                    redis = start_redis(log_dir=store_dir)
                    per_store.callback(redis.stop)
                    url = redis.url
                for experiment in config.experiments:
                    result.results += await _experiment(name, url, experiment, config, [s.url for s in sims],
                                                        store_dir)  # fmt: skip
    return result


async def _experiment(
    name: str, url: str, experiment: str, config: LimitsBenchConfig, workers: Sequence[str], store_dir: Path
) -> list[LimitResult]:
    """Two gateways of ``experiment`` on the store at ``url`` (its own key prefix), measured, then stopped."""
    cluster = name == "cluster"
    env = _env(store_dir, config, workers, redis_url=url, cluster=cluster, experiment=experiment)
    with ExitStack() as gateways_up:
        gateways: list[Proc] = []
        for i in range(2):
            gw = start_gateway(
                f"gateway-{name}-{experiment}-{i}",
                env={**env, "GEARSHIFT_SPOOL_DIR": str(store_dir / f"spool-{experiment}-{i}")},
                log_dir=store_dir,
            )
            gateways_up.callback(gw.stop)
            gateways.append(gw)
        store = RedisStore.from_url(url, prefix=env["GEARSHIFT_KEY_PREFIX"], cluster=cluster)
        await store.verify()
        try:
            return await _measure(name, [g.url for g in gateways], store, config, experiment)
        finally:
            await store.close()


def report(result: LimitsBenchResult, config: LimitsBenchConfig, *, command: str, load: str) -> str:
    rows = [
        [
            r.store,
            r.experiment,
            r.limit,
            f"{r.configured:g}",
            f"{r.admitted:g}",
            ("±1 %" + (f" ± {r.bound:g}" if r.bound else "")) if r.limit == "rpm" else f"≤ limit + {r.bound:g}",
            "met" if r.met else "**not met**",
            str(r.refused),
            r.detail,
        ]
        for r in result.results
    ]
    head = ["store", "experiment", "limit", "configured", "admitted", "target", "status", "refused", "detail"]
    return "\n".join(
        [
            "# Limits across gateway replicas",
            "",
            f"Regenerate with `{command}`. Two `gearshift gateway` processes on one store, {config.clients} concurrent "
            f"clients alternating between them, two simulated workers (speed-up {config.speedup:g}). {load}.",
            "",
            "Admitted: RPM, the requests answered 200 (all sent within one 60 s window); TPM, the ledger's prompt + "
            "completion tokens; concurrency, the most requests whose [admitted, finish] overlap in the ledger (the "
            "requests in progress at once, from the moment admission granted each to its finish); budget, the spend "
            "counter (USD) when the clients stopped. "
            "The TPM bound is the reserved-but-unsettled excess of the requests in flight: admission reserves the "
            "prompt estimate + `max_tokens` up front, so only a prompt longer than its estimate can overshoot, by at "
            "most clients × that excess. The budget bound: the requests in flight when the budget was reached, each at "
            "most the largest request's cost (a request is admitted while spend + this replica's unbilled spend is "
            "below the budget).",
            "",
            f"Experiment *exact*: no quota lease applies (the limits are too small for one). Experiment *leased*: "
            f"`GEARSHIFT_LEASE_FRACTION={config.lease_fraction:g}`, `GEARSHIFT_LEASE_MAX_OUTSTANDING="
            f"{config.lease_max_outstanding}`, `GEARSHIFT_LEASE_TTL_S={config.lease_ttl_s:g}`, so each replica serves "
            "RPM, TPM and the budget from leases; their stated bound is added: RPM and TPM ± max_outstanding × "
            "fraction × limit (units outstanding in leases, spent or not), the budget the fleet's largest spend within "
            "one lease TTL (what another replica's lease may not have seen yet). The leased concurrency tenant also "
            "has leased RPM and TPM; its slots are exact, admitted through the store.",
            "",
            "## Results",
            "",
            table(head, rows),
            "",
        ]
    )


def write(config: LimitsBenchConfig, out: Path, work: Path, *, command: str, load: str) -> Path:
    result = asyncio.run(run(config, work))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "limits.md"
    path.write_text(report(result, config, command=command, load=load))
    return path
