"""Gateway settings: ``GEARSHIFT_*`` environment variables on top of the settings every process shares."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, SecretStr, model_validator

from fleet.config import CommonSettings, exposure, refuse_dev_secrets

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
    stream_timeout_s: Seconds = 900.0
    """Streaming: the whole stream after its first byte; past it the stream ends with an error event and ``[DONE]``."""
    max_retries: Annotated[int, Field(ge=0, le=8)] = 2
    """Further workers tried when one fails before its first byte (connect error, 5xx, timeout)."""
    upstream_pool_size: Annotated[int, Field(gt=0)] = 1024
    upstream_keep_alive_s: Annotated[float, Field(gt=0)] = 4.0
    """A pooled upstream connection idle this long is closed: shorter than a vLLM worker's own idle timeout
    (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, 5 s by default), so the gateway never writes a request on a connection the
    worker is closing in that moment (no response: a retry elsewhere, and a failure counted against the worker)."""
    upstream_api_key: SecretStr | None = None
    """Bearer key the gateway sends every worker: vLLM's API key (``VLLM_API_KEY`` or ``--api-key`` on the worker), so
    that nothing but the gateways can call a worker's ``/v1`` API (deploy/kubernetes/kimi-k3). None sends no key."""

    # shared store outages
    store_failure_mode: Literal["open", "closed"] = "open"
    """When the shared store fails during admission: ``open`` serves on process-local limits, ``closed`` answers 503."""
    store_timeout_s: Annotated[float, Field(gt=0)] = 2.0
    """Longest an admission waits for the shared store before treating it as failed (``store_failure_mode``): a
    store that hangs (a frozen or partitioned Redis keeps its connections open and answers nothing) fails like one
    that refuses. A grant that lands after the deadline is given back. Also the deadline of each background ledger and
    settlement write, after which the batch is spooled or retried."""
    local_limit_share: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Share of each tenant limit this replica enforces on its own while failing open (1/N for N replicas);
    ``gateway_replicas`` lowers it to 1/N by itself."""
    gateway_replicas: Annotated[int, Field(gt=0)] = 1
    """At least this many gateway replicas share the store. The count each uses while failing open is the larger
    of this and the store's replica registry (``gateway.intake.replicas``) as last seen: each enforces limit / count."""
    replica_heartbeat_s: Seconds = 2.0
    """How often this replica heartbeats into the replica registry (it counts for three intervals)."""
    spool_dir: Path | None = None
    """Directory of the durable spool (``gateway.usage.spool``): usage records and settlements the store cannot take are
    kept there and replayed when it is back, surviving a kill -9. One directory per replica (a second process on
    it is refused at start). None: ``$XDG_STATE_HOME/gearshift/gateway-<port>`` (``~/.local/state/…``) when the
    store is Redis; the in-memory store needs none. On Kubernetes, a volume (``deploy/kubernetes``)."""
    concurrency_grace_s: Annotated[float, Field(ge=0)] = 0.05
    """A concurrency refusal is retried once after this long: the slot may belong to the client's own request,
    finished on another replica, whose settlement is still on its way to the store (``gateway.intake.admission``)."""
    lease_fraction: Annotated[float, Field(ge=0, le=0.1)] = 0.005
    """Quota leases (``gateway.intake.leases``): a lease of a tenant's RPM or TPM is this share of the limit, times
    this replica's share of the fleet (a limit whose lease would be under 2 units is not leased: each request asks
    the store). The fleet admits at most ``lease_max_outstanding × lease_fraction`` of a limit above it (1 % with
    the defaults). 0 turns leases off; a gateway on its in-process store never leases."""
    lease_refill_at: Annotated[float, Field(ge=0, le=1)] = 0.5
    """The next lease is asked for, in the background, once less than this share of the current one is left."""
    lease_max_outstanding: Annotated[int, Field(ge=1, le=2)] = 2
    """Leases of one limit a replica holds at once: 2 serves from one while the next is granted ahead; 1 asks for a
    new one only when the current one runs out (half the bound, a store call on the request path at each refill)."""
    lease_ttl_s: Seconds = 2.0
    """A lease ends this long after its grant and its unused part goes back; also how long a budget's last
    reported spend serves requests without the store."""
    ledger_linger_s: Annotated[float, Field(ge=0, le=1)] = 0.02
    """A usage record waits up to this long for others to share its ledger write (``gateway.usage.metering``): a
    sequential client's records then cost one store command per this interval, not one each; the budget counts them
    locally meanwhile. 0 writes each at once (when no write is under way). Only on a shared store."""
    settle_linger_s: Annotated[float, Field(ge=0, le=1)] = 0.01
    """A settlement (slot release, TPM correction) waits this long before it is written, so that the tenant's next
    admits carry its slot release instead (``gateway.intake.admission``); keep it well under
    ``concurrency_grace_s``, the time another replica allows a release to land. Only on a shared store."""
    spool_max_bytes: Annotated[int, Field(gt=0)] = 256 * 1024 * 1024
    """Bound of the spool; when full, records wait in memory, ``gearshift_gateway_spool_full`` is 1 and an error
    is logged."""
    ledger_journal_fsync: bool = False
    """``fsync`` each usage record's journal entry before the answer's end is sent (``gateway.usage.spool.Journal``,
    in the spool directory). Off, an answered request's record survives a kill of the gateway (the page cache has
    it) but not a power cut of its host; on, it survives both, at one disk flush per request."""

    def spool_path(self) -> Path | None:
        """The spool directory to use: ``spool_dir``, else the default state directory when the store is Redis."""
        if self.spool_dir is not None or not self.redis_url:
            return self.spool_dir
        state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
        return state / "gearshift" / f"gateway-{self.port}"

    # outlier ejection, shared through the store
    eject_after_failures: Annotated[int, Field(gt=0)] = 3
    """Consecutive failures of one worker, seen by one gateway, that eject it."""
    eject_for_s: Seconds = 30.0

    # background views of the fleet
    health_interval_s: Seconds = 2.0
    health_timeout_s: Seconds = 1.0
    health_timeouts_down: Annotated[int, Field(gt=0)] = 3
    """Consecutive timed-out probes that mark a worker down (a refused connection or an error status does at once)."""
    ready_without_workers: bool = False
    """``/readyz`` answers 200 while no worker is ready (its body says so), and requests get 503 with
    ``Retry-After``: a load balancer keeps the gateway in rotation through a fleet's cold start (an hour on Kimi K3)
    instead of leaving clients with connection errors. False: ``/readyz`` answers 503 until a worker is healthy."""
    no_worker_retry_after_s: Seconds = 10.0
    """``Retry-After`` of a 503 answered because no worker is ready, seconds."""
    state_refresh_s: Seconds = 0.5
    """How often worker states and ejections are re-read from the store (never per request)."""
    worker_state_max_age_s: Seconds = 30.0
    """A worker state the controller published longer ago than this (``WorkerState.updated_at``) is ignored, also
    while the store is away: the worker is then routed on its own health checks (issue 23)."""
    key_cache_ttl_s: Seconds = 5.0
    """How long a run-time API key lookup is cached; a revocation reaches other replicas within this."""

    # connections
    max_header_bytes: Annotated[int, Field(gt=0)] = 32 * 1024
    """Request line and headers together; more is answered 431."""
    max_headers: Annotated[int, Field(gt=0)] = 100
    header_timeout_s: Seconds = 5.0
    """A request head must be complete this long after it began (or after the connection opened)."""
    keep_alive_s: Annotated[int, Field(gt=0)] = 75
    """An idle client connection is closed this many seconds after its last response: longer than the idle timeouts
    of the clients and balancers in front (aiohttp 15 s, httpx 5 s, an AWS ALB 60 s), so that they close an idle
    connection first. One they reuse just as the gateway closes it fails with no response: uvicorn's own default, 5 s,
    lost requests of clients whose loop lagged a few seconds that way (the soak's transport errors, issue 23)."""
    max_connections: Annotated[int, Field(gt=0)] | None = None
    """Open connections (and tasks) beyond which new requests are answered 503; None for no limit."""

    # requests
    max_body_bytes: Annotated[int, Field(gt=0)] = 16 * 1024 * 1024
    """Body cap of every route but the admin API's, checked before the body is parsed: more is answered 413."""
    max_admin_body_bytes: Annotated[int, Field(gt=0)] = 1024 * 1024
    """Body cap of the admin API (``/admin/``), checked after the admin key and before the body is parsed."""
    admin_auth_failures_per_minute: Annotated[int, Field(gt=0)] = 10
    """Failed admin authentications one client address may make within a minute; then every admin request from it
    is answered 429 (nothing checked) until the oldest failure is a minute old (``gateway.intake.admin_guard``)."""
    default_max_tokens: Annotated[int, Field(gt=0)] = 4096
    """Tokens reserved against the tenant's TPM when a request does not set ``max_tokens``."""
    chars_per_token: Annotated[float, Field(gt=0)] = 4.0
    """Prompt-size estimate used for the up-front TPM reservation (reconciled with real usage after)."""
    tokens_per_message: Annotated[int, Field(ge=0)] = 4
    """Chat-template tokens per message in that estimate. An estimate below the worker's real count lets a
    tenant pass its TPM by the difference, so err high: over-reservation is refunded."""
    tokens_per_image: Annotated[int, Field(ge=0)] = 1024
    """Prompt tokens counted per image part in that estimate. ASSUMED: a 1024×1024 image through a ViT of 14-pixel
    patches merged 2×2 (Kimi's MoonViT) is about 1 340 tokens, OpenAI's high-detail tiling about 765;
    over-reservation is refunded after the worker's usage arrives."""
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
    metrics_token: SecretStr | None = None
    """Bearer token ``/metrics`` requires (``Authorization: Bearer …``, compared in constant time; 401 without it);
    None leaves ``/metrics`` open. Give Prometheus the same token (``authorization.credentials_file``)."""

    # TTFT-aware routing (gateway/routing/router.py, TtftScorer)
    weight_ttft: Weight = 1.0
    prefill_tokens_per_s: Annotated[float, Field(gt=0)] | None = None
    """A worker's prefill rate, tokens per second, for the predicted TTFT; None takes it from each worker's
    model profile (its chunked-prefill step, ``gateway.routing.scorers.ttft.profile_prefill_rate``)."""
    ttft_reference_s: Seconds = 2.0
    """The TTFT scale of the TTFT scorer for a tier without ``ttft_target_s``."""

    # prefix affinity (gateway/routing/prefix.py, PrefixScorer)
    weight_prefix: Weight = 2.0
    """Weight of the prefix scorer (0 turns prefix affinity off: no hashing, no index)."""
    prefix_block_chars: Annotated[int, Field(gt=0)] = 512
    """Characters per hashed prompt block (about 128 tokens)."""
    prefix_max_blocks: Annotated[int, Field(gt=0)] = 1024
    """Most leading blocks hashed per request: bounds the hashing cost (and the prefix followed)."""
    prefix_ttl_s: Seconds = 300.0
    """How long the index believes a worker still caches a block it was sent, seconds."""
    prefix_index_blocks: Annotated[int, Field(gt=0)] = 262_144
    """Most (block hash, worker) entries the index keeps (least recently used dropped first); about 200 bytes each."""
    prefix_load_factor: Annotated[float, Field(ge=1)] = 2.0
    """Bounded load: affinity holds only while the worker's load is at most this × (the least loaded + 1)."""

    # overload control (gateway/intake/overload.py, gateway/intake/fairqueue.py)
    overload_control: bool = True
    """Queue requests in the gateway when no worker of the model has headroom; off sends every request on."""
    overload_max_occupancy: Annotated[float, Field(gt=0)] = 1.0
    """Headroom: a worker takes a new request while ``load + prefill_tokens / prefill_tokens_per_slot`` is below
    this × its ``max_num_seqs`` (load = max(published running + waiting, this gateway's in-flight))."""
    overload_kv_threshold: Annotated[float, Field(gt=0, le=1)] = 0.95
    """Headroom: … and its published KV-cache usage is below this fraction."""
    overload_queue_size: Annotated[int, Field(gt=0)] = 1024
    """Requests the gateway queues per model at most."""
    overload_max_wait_s: Seconds = 30.0
    """How long a queued request of a tier without ``ttft_target_s`` waits before it is refused."""
    overload_quantum_tokens: Annotated[int, Field(gt=0)] = 8192
    """Deficit-round-robin quantum between the tenants of one band, tokens."""
    overload_tick_s: Seconds = 0.05
    """How often the queue expires late requests and re-checks headroom (capacity changes also dispatch at once)."""
    overload_rate_window_s: Seconds = 10.0
    """Window of the dispatch rate that predicts a new request's queued time."""
    brownout_auto: bool = True
    """The brownout switch starts in ``auto`` (on after sustained overload); False starts it ``off``."""
    brownout_after_s: Seconds = 10.0
    """Queue non-empty this long without a break turns the automatic brownout on."""
    brownout_recover_s: Seconds = 30.0
    """Queue empty this long turns it off again."""

    # the admin API and run-time tenants (gateway/http/tenants_admin.py, gateway/intake/tenant_book.py)
    admin_keys: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")], SecretStr] = Field(default_factory=dict)
    """Further named admin keys, id → key (``GEARSHIFT_ADMIN_KEYS='{"alice": "…"}'``); the audit trail names the
    id of the key that made each change (``admin`` for ``GEARSHIFT_ADMIN_KEY``)."""
    tenants_refresh_s: Seconds = 0.5
    """How often the tenants changed at run time are re-read from the store (every replica serves a change
    within about this)."""

    # the operator's console (gateway/http/console/), mounted with the admin API
    console_enabled: bool = True
    """Serve the console at ``/console`` (only while an admin key is set: the console signs in with one)."""
    console_session_ttl_s: Annotated[float, Field(gt=0, le=86_400)] = 900.0
    """Lifetime of a console session (its cookie), seconds."""
    console_login_failures: Annotated[int, Field(gt=0)] = 5
    """Failed console logins one client address may make within ``console_login_window_s`` before it must wait."""
    console_login_window_s: Seconds = 60.0
    """The window over which ``console_login_failures`` are counted, seconds."""

    def slot_ttl_s(self) -> float:
        """The longest a request holds its concurrency slot, seconds: a minute past the longest a request may run
        (``request_timeout_s``, or ``first_byte_timeout_s`` + ``stream_timeout_s``), so a slot never expires under a
        live request, and a crashed gateway's slots still free themselves."""
        return max(self.request_timeout_s, self.first_byte_timeout_s + self.stream_timeout_s) + 60.0

    def admin_credentials(self) -> dict[str, str]:
        """Every admin key by its id: ``admin`` for ``GEARSHIFT_ADMIN_KEY``, then the named ones."""
        named = {key_id: key.get_secret_value() for key_id, key in self.admin_keys.items()}
        return {"admin": self.admin_key.get_secret_value(), **named}

    @model_validator(mode="after")
    def _check_secrets(self) -> Self:
        """Outside the embedded default (Redis, or a public listen address) the development pepper and admin key
        are refused: anyone could mint the demo keys' digests or call the admin API."""
        secrets = {"key_pepper": self.key_pepper, "admin_key": self.admin_key}
        if self.upstream_api_key is not None:
            secrets["upstream_api_key"] = self.upstream_api_key
        exposed = exposure(redis_url=self.redis_url, host=self.host)
        refuse_dev_secrets(secrets, exposed=exposed, allowed=self.allow_dev_secrets)
        if "admin" in self.admin_keys:
            raise ValueError("admin_keys: the id 'admin' is GEARSHIFT_ADMIN_KEY's")
        if any(not v.get_secret_value() for v in self.admin_keys.values()):
            raise ValueError("admin_keys: a named admin key must not be empty")
        return self

    @model_validator(mode="after")
    def _check_timeouts(self) -> Self:
        if self.health_timeout_s > self.health_interval_s:
            raise ValueError("health_timeout_s: must not exceed health_interval_s")
        return self
