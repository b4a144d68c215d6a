"""Gateway settings: ``GEARSHIFT_*`` environment variables on top of the settings every process shares."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from fleet.config import CommonSettings

Seconds = Annotated[float, Field(gt=0)]
Weight = Annotated[float, Field(ge=0)]


class GatewaySettings(CommonSettings):
    """Everything the gateway process reads at start. Times are seconds, sizes bytes."""

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8080

    # routing: weights of the scorers (each scorer returns a value in [0, 1])
    weight_queue: Weight = 1.0
    weight_kv: Weight = 0.5
    weight_speculation: Weight = 2.0
    prefill_tokens_per_slot: Annotated[int, Field(gt=0)] = 1024
    """Outstanding prompt tokens (not yet prefilled) the queue scorer counts as one more request on a worker:
    a worker prefilling a long prompt admits new requests late, so it must look busy to the router."""

    # upstream
    connect_timeout_s: Seconds = 2.0
    first_byte_timeout_s: Seconds = 120.0
    """Streaming: from sending the request to the first body byte (covers queueing and prefill)."""
    idle_timeout_s: Seconds = 60.0
    """Streaming: the longest gap between two chunks before the stream is declared dead."""
    request_timeout_s: Seconds = 900.0
    """Non-streaming: the whole response."""
    max_retries: Annotated[int, Field(ge=0, le=8)] = 2
    """Further workers tried when one fails before its first byte (connect error, 5xx, timeout)."""
    upstream_pool_size: Annotated[int, Field(gt=0)] = 1024

    # shared store outages
    store_failure_mode: Literal["open", "closed"] = "open"
    """When the shared store fails during admission: ``open`` serves on process-local limits, ``closed`` answers 503."""
    local_limit_share: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Share of each tenant limit this replica enforces on its own while failing open (1/N for N replicas)."""

    # outlier ejection, shared through the store
    eject_after_failures: Annotated[int, Field(gt=0)] = 3
    """Consecutive failures of one worker, seen by one gateway, that eject it."""
    eject_for_s: Seconds = 30.0

    # background views of the fleet
    health_interval_s: Seconds = 2.0
    health_timeout_s: Seconds = 1.0
    health_timeouts_down: Annotated[int, Field(gt=0)] = 3
    """Consecutive timed-out probes that mark a worker down (a refused connection or an error status does at once)."""
    state_refresh_s: Seconds = 0.5
    """How often worker states and ejections are re-read from the store (never per request)."""
    key_cache_ttl_s: Seconds = 5.0
    """How long a run-time API key lookup is cached; a revocation reaches other replicas within this."""

    # connections
    max_header_bytes: Annotated[int, Field(gt=0)] = 32 * 1024
    """Request line and headers together; more is answered 431."""
    max_headers: Annotated[int, Field(gt=0)] = 100
    header_timeout_s: Seconds = 5.0
    """A request head must be complete this long after it began (or after the connection opened)."""
    max_connections: Annotated[int, Field(gt=0)] | None = None
    """Open connections (and tasks) beyond which new requests are answered 503; None for no limit."""

    # requests
    max_body_bytes: Annotated[int, Field(gt=0)] = 16 * 1024 * 1024
    default_max_tokens: Annotated[int, Field(gt=0)] = 4096
    """Tokens reserved against the tenant's TPM when a request does not set ``max_tokens``."""
    chars_per_token: Annotated[float, Field(gt=0)] = 4.0
    """Prompt-size estimate used for the up-front TPM reservation (reconciled with real usage after)."""
    tokens_per_message: Annotated[int, Field(ge=0)] = 4
    """Chat-template tokens per message in that estimate. An estimate below the worker's real count lets a
    tenant pass its TPM by the difference, so err high: over-reservation is refunded."""
    max_messages: Annotated[int, Field(gt=0)] = 1024
    """Most messages (or completion prompts) in one request; more is a 400."""
    max_n: Annotated[int, Field(gt=0)] = 128
    """Most choices (``n``, ``best_of``) in one request; more is a 400."""
    send_priority: bool = True
    """Pass the tier's priority to the worker's ``priority`` field (workers must run priority scheduling)."""

    # telemetry
    otlp_endpoint: str | None = None
    """OTLP/HTTP traces endpoint (for example ``http://collector:4318/v1/traces``); None turns tracing off."""
    service_name: str = "gearshift-gateway"

    @model_validator(mode="after")
    def _check_timeouts(self) -> Self:
        if self.health_timeout_s > self.health_interval_s:
            raise ValueError("health_timeout_s: must not exceed health_interval_s")
        return self
