"""The soak run's deployment: a Redis, simulated workers and gateway replicas as separate processes on
loopback, with a generated fleet file and a soak tenants file (several tenants and tiers, several keys each,
one tenant with a deliberately small request limit so intended 429s appear)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench.procs import Proc, start_gateway, start_redis, start_sim
from fleet.config import key_digest

MODEL = "kimi-k3"
KEY_PREFIX = "soak:"


@dataclass(frozen=True, slots=True)
class SoakTenant:
    id: str
    tier: str
    weight: float
    """Share of the client traffic this tenant sends."""
    keys: int
    rpm: int | None = None
    max_concurrency: int | None = None

    @property
    def limited(self) -> bool:
        """Its limits are meant to trip under the soak's load (its 429s are intended)."""
        return (self.rpm is not None and self.rpm < 1000) or self.max_concurrency is not None


SOAK_TENANTS: tuple[SoakTenant, ...] = (
    SoakTenant("acme", "interactive", 0.35, keys=3),
    SoakTenant("globex", "interactive", 0.2, keys=2),
    SoakTenant("initech", "batch", 0.3, keys=2),
    SoakTenant("hooli", "standard", 0.1, keys=2),
    SoakTenant("umbrella", "batch", 0.05, keys=1, rpm=120),
)
TIERS = {
    "interactive": {"priority": 0, "ttft_target_s": 2.0, "tpot_target_s": 0.05, "speculation": "speed"},
    "standard": {"priority": 5, "tpot_target_s": 0.1, "speculation": "neutral"},
    "batch": {"priority": 10, "speculation": "throughput", "sheddable": True},
}


@dataclass
class SoakSecrets:
    pepper: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    admin_key: str = field(default_factory=lambda: "gs-admin-" + secrets.token_urlsafe(24))
    keys: dict[str, list[str]] = field(default_factory=dict)
    """Tenant id → its API key secrets (generated per run, never written to disk)."""


def tenants_document(tenants: tuple[SoakTenant, ...], sec: SoakSecrets) -> dict[str, object]:
    """The soak tenants file's content; fills ``sec.keys`` with fresh secrets."""
    out = []
    for t in tenants:
        sec.keys[t.id] = ["gs-soak-" + secrets.token_urlsafe(24) for _ in range(t.keys)]
        entry: dict[str, object] = {
            "id": t.id,
            "tier": t.tier,
            "models": [MODEL],
            "tpm": 100_000_000,
            "keys": [
                {"id": f"{t.id}-{i}", "digest": key_digest(s, pepper=sec.pepper)} for i, s in enumerate(sec.keys[t.id])
            ],
        }
        if t.rpm is not None:
            entry["rpm"] = t.rpm
        if t.max_concurrency is not None:
            entry["max_concurrency"] = t.max_concurrency
        out.append(entry)
    return {"tiers": TIERS, "tenants": out}


def fleet_document(urls: list[str]) -> dict[str, object]:
    return {
        "models": [{"name": MODEL}],
        "workers": [{"id": f"sim-{i}", "url": u, "model": MODEL} for i, u in enumerate(urls)],
    }


@dataclass
class SoakStack:
    redis: Proc
    workers: list[Proc]
    gateways: list[Proc]
    secrets: SoakSecrets
    config_dir: Path

    @property
    def processes(self) -> list[Proc]:
        return [self.redis, *self.workers, *self.gateways]

    @property
    def gateway_urls(self) -> list[str]:
        return [g.url for g in self.gateways]


@contextlib.contextmanager
def soak_stack(
    run_dir: Path,
    *,
    workers: int,
    replicas: int,
    speedup: float,
    tenants: tuple[SoakTenant, ...] = SOAK_TENANTS,
    gateway_env: dict[str, str] | None = None,
) -> Iterator[SoakStack]:
    """Start Redis, ``workers`` simulated workers and ``replicas`` ``gearshift gateway`` processes; stop all."""
    started: list[Proc] = []
    try:
        redis = start_redis(log_dir=run_dir)
        started.append(redis)
        sims = []
        for i in range(workers):
            sims.append(start_sim(f"soak-{i}", log_dir=run_dir, speedup=speedup, seed=i))
            started.append(sims[-1])
        sec = SoakSecrets()
        config_dir = run_dir / "config"
        config_dir.mkdir(parents=True, exist_ok=True)
        (config_dir / "fleet.yaml").write_text(yaml.safe_dump(fleet_document([s.url for s in sims])))
        (config_dir / "tenants.yaml").write_text(yaml.safe_dump(tenants_document(tenants, sec)))
        env = {
            "GEARSHIFT_FLEET_FILE": str(config_dir / "fleet.yaml"),
            "GEARSHIFT_TENANTS_FILE": str(config_dir / "tenants.yaml"),
            "GEARSHIFT_REDIS_URL": redis.url,
            "GEARSHIFT_KEY_PREFIX": KEY_PREFIX,
            "GEARSHIFT_KEY_PEPPER": sec.pepper,
            "GEARSHIFT_ADMIN_KEY": sec.admin_key,
            "GEARSHIFT_HOST": "127.0.0.1",
            "GEARSHIFT_LOG_LEVEL": "INFO",
            **(gateway_env or {}),
        }
        gateways = []
        for i in range(replicas):
            gateways.append(start_gateway(f"gateway-{i}", env=env, log_dir=run_dir))
            started.append(gateways[-1])
        yield SoakStack(redis=redis, workers=sims, gateways=gateways, secrets=sec, config_dir=config_dir)
    finally:
        for proc in reversed(started):
            proc.stop()
