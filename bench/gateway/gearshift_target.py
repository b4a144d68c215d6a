"""The gearshift gateway as a benchmark target, with all of its work on: API-key auth, rate/token/concurrency
limits and budget, routing, metering to the ledger, Prometheus metrics. Two targets: the store in process memory
(``gearshift-memory``, the one-process mode) and on the bench's real Redis (``gearshift-redis``, replicas).

The bench's fleet is one worker (the fake upstream); its tenant has limits far above the offered load, so
every request pays for the limit checks without being refused. The gateway runs as ``gearshift gateway``
with ``GEARSHIFT_FLEET_FILE``, ``GEARSHIFT_TENANTS_FILE`` and (for Redis) ``GEARSHIFT_REDIS_URL`` pointing at the
bench's.
"""

from __future__ import annotations

import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.gateway.baseline import gateway_entry
from bench.gateway.targets import Target
from bench.procs import free_port, spawn, wait_http_ready
from fleet.config import (
    ApiKeyConfig,
    DrafterConfig,
    FleetConfig,
    ModelConfig,
    TenantConfig,
    TenantsConfig,
    TierConfig,
    WorkerConfig,
    WorkerKind,
    key_digest,
)

BENCH_KEY = "gs-bench-key"
"""The benchmark tenant's API key (loopback only)."""
MODEL = "kimi-k3"


def bench_fleet(upstream: str) -> FleetConfig:
    return FleetConfig(
        models=(ModelConfig(name=MODEL),),
        workers=(
            WorkerConfig(id="upstream", url=upstream, model=MODEL, kind=WorkerKind.VLLM, drafter=DrafterConfig()),
        ),
    )


def bench_tenants(pepper: str) -> TenantsConfig:
    return TenantsConfig(
        tiers={"interactive": TierConfig(priority=0, ttft_target_s=2.0, tpot_target_s=0.05)},
        tenants=(
            TenantConfig(
                id="bench",
                tier="interactive",
                rpm=1_000_000_000,
                tpm=1_000_000_000_000,
                max_concurrency=100_000,
                budget_usd=1e12,
                keys=(ApiKeyConfig(id="bench-1", digest=key_digest(BENCH_KEY, pepper=pepper)),),
            ),
        ),
    )


def write_config(directory: Path, *, upstream: str, pepper: str) -> tuple[Path, Path]:
    """The bench's fleet and tenants files, as an operator would write them; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    fleet_path, tenants_path = directory / "bench-fleet.yaml", directory / "bench-tenants.yaml"
    # Defaults left out, so the gateway of an older revision (``--baseline``) reads the same files.
    fleet = bench_fleet(upstream).model_dump(mode="json", exclude_defaults=True)
    fleet_path.write_text(yaml.safe_dump(fleet, sort_keys=False))
    tenants = bench_tenants(pepper).model_dump(mode="json", exclude_defaults=True)
    tenants_path.write_text(yaml.safe_dump(tenants, sort_keys=False))
    return fleet_path, tenants_path


@dataclass(frozen=True)
class GearshiftLauncher:
    """``gearshift gateway`` exactly as deployed (its own CLI and server), configured by files and env, with its
    store on the bench's Redis (``redis=True``) or in process memory."""

    name: str = "gearshift-redis"
    redis: bool = True
    source: Path | None = None
    """Another revision's tree to run (``bench.gateway.baseline``); None runs this checkout."""
    workers: int = 1
    """``gearshift gateway --workers N``: N processes on the port (Redis only)."""

    def launch(self, *, upstream: str, redis_url: str, cpu: int | None, log_dir: Path) -> Target:
        port = free_port()
        pepper = "gearshift-bench-pepper"
        fleet_path, tenants_path = write_config(log_dir, upstream=upstream, pepper=pepper)
        env = {
            "GEARSHIFT_FLEET_FILE": str(fleet_path),
            "GEARSHIFT_TENANTS_FILE": str(tenants_path),
            "GEARSHIFT_REDIS_URL": redis_url if self.redis else "",
            "GEARSHIFT_KEY_PEPPER": pepper,
            # Not the development values, which a gateway on Redis (shared mode) refuses.
            "GEARSHIFT_ADMIN_KEY": secrets.token_urlsafe(24),
            "GEARSHIFT_CONTROL_TOKEN": secrets.token_urlsafe(24),
            "GEARSHIFT_LOG_LEVEL": "WARNING",
            "GEARSHIFT_SPOOL_DIR": str(log_dir / f"spool-{port}"),  # never an operator's state directory
        }
        argv = [sys.executable, "-c", gateway_entry(self.source), "gateway", "--port", str(port)]
        if self.workers > 1:
            argv += ["--workers", str(self.workers)]
        # N processes get the machine's CPUs (their cost is reported per request, in CPU µs, not as req/s per core)
        child = spawn(self.name, argv, cpu=cpu if self.workers == 1 else None, log_dir=log_dir, env=env)
        base = f"http://127.0.0.1:{port}"
        wait_http_ready(child, base + "/v1/models", headers={"Authorization": f"Bearer {BENCH_KEY}"}, timeout_s=60)
        where = "on Redis" if self.redis else "in process memory"
        if self.source is not None:
            where += f", code of {self.source.name}"
        if self.workers > 1:
            where += f", {self.workers} processes (`--workers {self.workers}`)"
        return Target(
            self.name,
            base,
            api_key=BENCH_KEY,
            child=child,
            note=f"`gearshift gateway`: auth, limits + budget {where}, routing, metering, metrics",
        )


def gearshift_launchers(source: Path | None = None, *, suffix: str = "") -> list[GearshiftLauncher]:
    """The gateway with its store in memory and on Redis (both with all of its other work on); ``source`` and
    ``suffix`` name another revision's tree and its targets (``gearshift-memory@REV``)."""
    launchers = [
        GearshiftLauncher(f"gearshift-memory{suffix}", redis=False, source=source),
        GearshiftLauncher(f"gearshift-redis{suffix}", redis=True, source=source),
    ]
    if source is None:  # an older revision may not have --workers
        launchers.append(GearshiftLauncher("gearshift-redis-2proc", redis=True, workers=2))
    return launchers


def limits_note(workers: int = 1) -> list[str]:
    """How a gateway on Redis enforces the bench tenant's limits (``bench_tenants``) under the default lease policy
    (``GatewaySettings.lease_*``), as Markdown bullets; ``workers`` processes share each leased limit."""
    from fleet.store.rides import RIDE_S
    from gateway.intake.leases import LeasePolicy
    from gateway.settings import GatewaySettings

    fields = GatewaySettings.model_fields
    policy = LeasePolicy(
        fraction=fields["lease_fraction"].default,
        ttl_s=fields["lease_ttl_s"].default,
        refill_at=fields["lease_refill_at"].default,
        max_outstanding=fields["lease_max_outstanding"].default,
    )
    (tenant,) = bench_tenants("").tenants
    assert tenant.rpm is not None
    assert tenant.tpm is not None
    assert tenant.budget_usd is not None
    share = 1.0 / workers
    return [
        f"- RPM {tenant.rpm:,}: **leased**, slices of {policy.size(tenant.rpm, share):,} requests per process "
        f"(renewed {policy.ttl_s:g} s after each grant), served without the store.",
        f"- TPM {tenant.tpm:,}: **leased**, slices of {policy.size(tenant.tpm, share):,} tokens, corrected there.",
        f"- Budget {tenant.budget_usd:,.0f} USD: **leased** (the last spend the store reported, fresh for "
        f"{policy.ttl_s:g} s, under the limit less a {policy.headroom(1.0, share):.0%} headroom); it rides on the "
        "concurrency admit, where it is checked exactly.",
        f"- Concurrency {tenant.max_concurrency:,}: **exact**, one admit per request in the store (the admits of one "
        "event-loop tick are one script call).",
        f"- Everything else rides on those admits while they flow (`fleet.store.rides`, at most {RIDE_S * 1000:g} ms): "
        "ledger "
        "appends, settlements (slot releases, token corrections), lease grants and returns, and the background reads "
        "(worker states, ejections, plans, modes, run-time tenants, the replica heartbeat). At c=1 the floor is one "
        "command per request; at higher concurrency one admit carries many requests.",
    ]
