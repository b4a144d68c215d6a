"""Controller settings: ``CommonSettings`` plus the loop's knobs, from ``GEARSHIFT_*`` environment variables.

Nested tuning blocks use ``__``: ``GEARSHIFT_STABILISER__MIN_DWELL_S=20``, ``GEARSHIFT_POLICY__KV_HIGH=0.85``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from controller.drafter_free import DrafterFreeConfig
from controller.estimator import EstimatorConfig
from controller.placement import PlacementConfig
from controller.policy import PolicyConfig
from controller.stabiliser import StabiliserConfig
from fleet.config import CommonSettings, exposure, refuse_dev_secrets


class SourceKind(StrEnum):
    SCRAPE = "scrape"
    """``GET /metrics`` on every worker."""
    PROMETHEUS = "prometheus"
    """Instant queries to ``prometheus_url``."""


class ControllerSettings(CommonSettings):
    model_config = SettingsConfigDict(env_prefix="GEARSHIFT_", extra="forbid", frozen=True, env_nested_delimiter="__")

    tick_s: Annotated[float, Field(gt=0)] = 2.0
    """Seconds between controller ticks."""
    schedule_lease_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    """Lease carried by every speculation PUT; workers revert to their start-up schedule when it runs out."""
    leader_lease_s: Annotated[float, Field(gt=0)] = 10.0
    """TTL of the leader lease in the store; a standby takes over within two of these."""
    leader_lease_name: str = "controller"
    holder_id: str | None = None
    """This replica's name in the leader lease; None makes one from the host name and process id."""
    dry_run: bool = False
    """Shadow mode: decide, log and export metrics, never PUT."""
    canary_worker: str | None = None
    """Apply new k values to this worker first; the others follow once it ran ``canary_ticks`` without regression."""
    canary_ticks: Annotated[int, Field(ge=1)] = 5
    source: SourceKind = SourceKind.SCRAPE
    prometheus_url: str | None = None
    metrics_port: Annotated[int, Field(ge=0, le=65535)] = 9400
    """Port of the controller's own /metrics (0 disables it)."""
    metrics_host: str = "127.0.0.1"
    metrics_token: SecretStr | None = None
    """Bearer token the controller's ``/metrics`` requires (``Authorization: Bearer …``, compared in constant time;
    401 without it), as the gateway's; None leaves it open. Give Prometheus the same token."""
    state_ttl_s: Annotated[float, Field(gt=0)] = 10.0
    """TTL of the worker state published to the store."""
    max_backoff_s: Annotated[float, Field(gt=0)] = 30.0
    tenant_interval_s: Annotated[float, Field(gt=0)] = 60.0
    """How often the workers' cost is split over tenants from the usage ledger (seconds)."""
    policy: PolicyConfig = PolicyConfig()
    stabiliser: StabiliserConfig = StabiliserConfig()
    estimator: EstimatorConfig = EstimatorConfig()
    placement: PlacementConfig = PlacementConfig()
    """Fleet placement's planning loop (``controller.placement``)."""
    drafter_free: DrafterFreeConfig = DrafterFreeConfig()
    """The drafter-free gear (``controller.drafter_free``, ``controller.gear_mode``): off unless
    ``GEARSHIFT_DRAFTER_FREE__ENABLED=true``."""

    @model_validator(mode="after")
    def _check_secrets(self) -> Self:
        """In shared mode the development control token is refused (anyone could set the workers' gears)."""
        exposed = exposure(redis_url=self.redis_url, host=None)
        refuse_dev_secrets({"control_token": self.control_token}, exposed=exposed, allowed=self.allow_dev_secrets)
        return self

    @model_validator(mode="after")
    def _cross_check(self) -> Self:
        if self.schedule_lease_s < 2 * self.tick_s:
            raise ValueError(f"schedule_lease_s: {self.schedule_lease_s} must be at least 2 × tick_s ({self.tick_s})")
        if self.leader_lease_s <= self.tick_s:
            raise ValueError(f"leader_lease_s: {self.leader_lease_s} must exceed tick_s ({self.tick_s})")
        if self.source is SourceKind.PROMETHEUS and not self.prometheus_url:
            raise ValueError("prometheus_url: required when source is 'prometheus'")
        if self.stabiliser.probe_s < 2 * self.tick_s:
            raise ValueError(f"stabiliser.probe_s: must be at least 2 × tick_s ({self.tick_s}) to measure a probe")
        if self.state_ttl_s < self.tick_s:
            raise ValueError(f"state_ttl_s: {self.state_ttl_s} must be at least tick_s ({self.tick_s})")
        return self
