"""Typed configuration: the fleet file, the tenants file, and the settings every process shares (DESIGN §3.4).

Both YAML files are validated at start; a bad file raises ``ConfigError`` whose message names the file and
the field (``tenants.yaml: tenants[2].tier: unknown tier 'gold' …``). API keys appear only as keyed digests.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Mapping
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Self, TypeVar
from urllib.parse import unquote, urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleet.budget_period import BudgetPeriod
from fleet.metric_labels import TenantLabeler, TenantLabelMode


class ConfigError(ValueError):
    """A configuration file or setting is invalid; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------------------------- fleet file
class DrafterConfig(_Strict):
    name: str = "Kimi-K3-DSpark"
    method: str = "dspark"
    """vLLM speculative method: ``dspark`` for Kimi K3, ``ngram`` or ``draft_model`` for small test models."""
    k_max: Annotated[int, Field(ge=1, le=16)] = 8
    model: str | None = None
    """Drafter weights (path or repo id) for model-based methods; None for ``ngram``."""
    idle_skip: bool = False
    """The worker runs the gearshift plugin's idle-drafter skip (``GEARSHIFT_IDLE_DRAFTER=skip``, issue 24): at
    k = 0 its drafter does no work, so a pool the fleet plan pins at k = 0 may serve ``speculation: off``."""


class PricingConfig(_Strict):
    """Prompt-token prices a model's requests pay on top of the work they cost (``gateway.usage.metering``)."""

    prompt_usd_per_mtok: Annotated[float, Field(ge=0)] = 0.0
    """USD per million prompt tokens the worker prefilled; 0 charges the work cost alone."""
    cached_prompt_discount: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Share of the prompt price taken off for tokens served from the worker's prefix cache
    (``prompt_tokens_details.cached_tokens``): 0.9 charges them a tenth of the prompt price."""

    @property
    def cached_prompt_usd_per_mtok(self) -> float:
        """USD per million cached prompt tokens."""
        return self.prompt_usd_per_mtok * (1.0 - self.cached_prompt_discount)


class ModelConfig(_Strict):
    name: str
    """The model name clients send and workers serve."""
    profile: str = "kimi-k3-dspark-tp16"
    """Performance profile (step time, acceptance) used by the simulator and the controller."""
    context_window: Annotated[int, Field(gt=0)] = 1_000_000
    pricing: PricingConfig = PricingConfig()


class WorkerKind(StrEnum):
    SIM = "sim"
    VLLM = "vllm"


class WorkerConfig(_Strict):
    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    url: Annotated[str, Field(pattern=r"^https?://")]
    model: str
    kind: WorkerKind = WorkerKind.SIM
    weights: str | None = None
    """Real workers: path or hub id of the served model's weights; None serves ``model`` by that name."""
    gpus: Annotated[int, Field(gt=0)] = 16
    usd_per_gpu_hour: Annotated[float, Field(ge=0)] = 3.0
    drafter: DrafterConfig = DrafterConfig()
    max_num_seqs: Annotated[int, Field(gt=0, le=4096)] = 256
    tensor_parallel_size: Annotated[int, Field(gt=0)] = 16
    extra_args: tuple[str, ...] = ()
    """Further ``vllm serve`` arguments for real workers."""
    restart_url: Annotated[str, Field(pattern=r"^https?://")] | None = None
    """Where the worker's restart control listens (``fleet.restart``): the vLLM supervisor's address; None: the
    worker's own ``url`` (the simulated worker serves it there)."""
    allow_drafter_free: bool = True
    """The operator's per-worker switch: False keeps this worker in the mode it was started in (the controller
    never takes it to the drafter-free gear or back; the fleet-wide switch is ``GEARSHIFT_DRAFTER_FREE__ENABLED``)."""
    tool_call_parser: str | None = None
    """Real workers: vLLM's ``--tool-call-parser`` (``kimi_k3`` for Kimi K3); set, the launcher also passes
    ``--enable-auto-tool-choice`` so ``tool_choice: "auto"`` works. None: named and required tool choice only."""
    reasoning_parser: str | None = None
    """Real workers: vLLM's ``--reasoning-parser`` (``kimi_k3`` for Kimi K3), which splits the reasoning from the
    answer (the message's ``reasoning`` field)."""

    @property
    def restart_base_url(self) -> str:
        """Where the controller asks for a restart (``restart_url``, else ``url``)."""
        return self.restart_url or self.url

    @property
    def usd_per_second(self) -> float:
        """Cost of running this worker, USD per second."""
        return self.gpus * self.usd_per_gpu_hour / 3600.0


class FleetConfig(_Strict):
    models: tuple[ModelConfig, ...]
    workers: tuple[WorkerConfig, ...]

    @model_validator(mode="after")
    def _cross_check(self) -> Self:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"models: duplicate model name in {names}")
        ids = [w.id for w in self.workers]
        if len(set(ids)) != len(ids):
            raise ValueError(f"workers: duplicate worker id in {ids}")
        for i, w in enumerate(self.workers):
            if w.model not in names:
                raise ValueError(f"workers[{i}].model: unknown model {w.model!r}; known: {names}")
        return self

    def model(self, name: str) -> ModelConfig | None:
        return next((m for m in self.models if m.name == name), None)

    def worker(self, worker_id: str) -> WorkerConfig | None:
        return next((w for w in self.workers if w.id == worker_id), None)

    def profile_of(self, worker_id: str) -> str:
        """The performance profile (a name or a YAML path) of ``worker_id``'s model; every worker names a known
        model (validated above), so this never guesses. Raises ``KeyError`` for an unknown worker."""
        worker = self.worker(worker_id)
        if worker is None:
            raise KeyError(worker_id)
        model = self.model(worker.model)
        assert model is not None  # _cross_check
        return model.profile


# ------------------------------------------------------------------------------------------- tenants file
class SpeculationPreference(StrEnum):
    """How the speculation scorer ranks the workers a request may use (a soft preference: ``TierConfig.prefer``)."""

    SPEED = "speed"
    """Per-user speed first: prefer workers running a high k with good acceptance."""
    THROUGHPUT = "throughput"
    """Cost first: indifferent to k, prefer spare capacity."""
    NEUTRAL = "neutral"


class SpeculationMode(StrEnum):
    """Which workers may serve a request, by how they speculate (a hard rule: ``TierConfig.speculation``, or the
    request's ``x-gearshift-speculation`` header where its tenant may send it; ``gateway.routing.filters``)."""

    AUTO = "auto"
    """Any worker, at whatever gear the controller runs it."""
    OFF = "off"
    """Only workers that decode without drafts: started without a drafter (``fleet.worker_mode``)."""
    FAST = "fast"
    """The workers with the highest k whose predicted TPOT still meets the tier's target."""


_LEGACY_SPECULATION = frozenset(p.value for p in SpeculationPreference)


class TierConfig(_Strict):
    priority: int = 0
    """Passed to vLLM's ``priority`` field: lower runs first."""
    ttft_target_s: Annotated[float, Field(gt=0)] | None = None
    tpot_target_s: Annotated[float, Field(gt=0)] | None = None
    """Target time per output token, seconds; None means no TPOT target (batch work)."""
    speculation: SpeculationMode = SpeculationMode.AUTO
    """Which workers may serve the tier's requests (``SpeculationMode``)."""
    prefer: SpeculationPreference = SpeculationPreference.NEUTRAL
    """How the speculation scorer ranks the workers it may use. Before issue 25 this was ``speculation``: a file
    that still gives ``speculation: speed | throughput | neutral`` is read as this field (``speculation: auto``)."""
    sheddable: bool = False
    """Under overload the gateway refuses this tier's requests first (429 ``overload``) rather than keep them
    queued past their TTFT target; a tier that is not sheddable waits up to its target, then gets a 503."""
    brownout_max_tokens: Annotated[int, Field(gt=0)] | None = None
    """While the gateway's brownout is on, new requests of this tier get at most this ``max_tokens``; None
    leaves them alone."""

    @model_validator(mode="before")
    @classmethod
    def _legacy_speculation(cls, data: Any) -> Any:
        """``speculation: speed | throughput | neutral`` (the field before issue 25) is the soft preference now:
        moved to ``prefer``, over any ``prefer`` given beside it, so an old file or an old admin body keeps its
        meaning."""
        if isinstance(data, dict) and data.get("speculation") is False:  # YAML 1.1 reads a bare `off` as false
            data = {**data, "speculation": SpeculationMode.OFF}
        if isinstance(data, dict) and str(data.get("speculation")) in _LEGACY_SPECULATION:
            data = {**data, "prefer": data["speculation"], "speculation": SpeculationMode.AUTO}
        return data


class ApiKeyConfig(_Strict):
    id: str
    digest: Annotated[str, Field(pattern=r"^hmac-sha256:[0-9a-f]{64}$")]


class TenantConfig(_Strict):
    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    tier: str
    models: tuple[str, ...] = ("*",)
    """Model names this tenant may use; ``*`` allows every model."""
    rpm: Annotated[int, Field(gt=0)] | None = None
    tpm: Annotated[int, Field(gt=0)] | None = None
    max_concurrency: Annotated[int, Field(gt=0)] | None = None
    budget_usd: Annotated[float, Field(ge=0)] | None = None
    budget_period: BudgetPeriod = "total"
    """What ``budget_usd`` is per: ``total`` (all time, reset only by the admin API), or ``daily``, ``weekly`` (from
    Monday) or ``monthly``, calendar periods in UTC that reset at their first instant (``fleet.budget_period``)."""
    suspended: bool = False
    """A suspended tenant's keys still authenticate, and each of its requests is refused (403 ``tenant_suspended``)."""
    keys: tuple[ApiKeyConfig, ...] = ()
    workload: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")] | None = None
    """The workload of this tenant's requests that send no ``x-gearshift-workload`` header (``chat``, ``maths``
    …): with the tier, the request's traffic class in the fleet plan (``fleet.plan``). None: ``default``."""
    speculation_header: tuple[SpeculationMode, ...] = ()
    """The values of the ``x-gearshift-speculation`` request header this tenant may send (each one overrides its
    tier's ``speculation`` for that request); empty: the header is refused (400 naming it)."""

    @field_validator("speculation_header", mode="before")
    @classmethod
    def _bare_off(cls, value: Any) -> Any:
        """YAML 1.1 reads a bare ``off`` as false: take it as the mode it names."""
        if isinstance(value, list | tuple):
            return [SpeculationMode.OFF if v is False else v for v in value]
        return value

    def allows(self, model: str) -> bool:
        return "*" in self.models or model in self.models


class TenantsConfig(_Strict):
    tiers: dict[str, TierConfig]
    tenants: tuple[TenantConfig, ...]

    @model_validator(mode="after")
    def _cross_check(self) -> Self:
        ids = [t.id for t in self.tenants]
        if len(set(ids)) != len(ids):
            raise ValueError(f"tenants: duplicate tenant id in {ids}")
        for i, t in enumerate(self.tenants):
            if t.tier not in self.tiers:
                raise ValueError(f"tenants[{i}].tier: unknown tier {t.tier!r}; known: {sorted(self.tiers)}")
        return self

    def tenant(self, tenant_id: str) -> TenantConfig | None:
        return next((t for t in self.tenants if t.id == tenant_id), None)


def key_digest(secret: str, *, pepper: str) -> str:
    """Keyed digest of an API key secret: ``hmac-sha256:<hex>``. Only digests are ever stored."""
    mac = hmac.new(pepper.encode(), secret.encode(), hashlib.sha256).hexdigest()
    return f"hmac-sha256:{mac}"


# ------------------------------------------------------------------------------------------------ loading
def _format_errors(source: str, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in e["loc"]).replace(".[", "[")
        msg = e["msg"]
        if not loc and e["type"] == "value_error":
            # A cross-field check: its message already starts with the field it names.
            lines.append(f"{source}: {msg.removeprefix('Value error, ')}")
            continue
        lines.append(f"{source}: {loc or '(top level)'}: {msg}")
    return "\n".join(lines)


def load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc


M = TypeVar("M", bound=BaseModel)


def parse_model(model: type[M], data: Any, *, source: str) -> M:
    """Validate ``data`` as ``model``; errors become a ``ConfigError`` naming ``source`` and each field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(source, exc)) from exc


def _default_path(name: str) -> Path:
    return Path(str(resources.files("fleet.defaults").joinpath(name)))


def load_fleet(path: Path | None = None) -> FleetConfig:
    """Load the fleet file, or the embedded default fleet (simulated workers on loopback) when ``path`` is None."""
    path = path or _default_path("fleet.yaml")
    return parse_model(FleetConfig, load_yaml(path), source=str(path))


def load_tenants(path: Path | None = None) -> TenantsConfig:
    """Load the tenants file, or the embedded default tenants when ``path`` is None."""
    path = path or _default_path("tenants.yaml")
    return parse_model(TenantsConfig, load_yaml(path), source=str(path))


# ----------------------------------------------------------------------------------------------- settings
DEV_SECRETS: Mapping[str, str] = {
    "key_pepper": "gearshift-dev-pepper",
    "admin_key": "gearshift-dev-admin",
    "control_token": "gearshift-dev-control",
}
"""Setting → its development default: public values (the embedded demo tenants' key digests use the pepper)."""


def exposure(*, redis_url: str | None, host: str | None) -> str | None:
    """Why a process is outside the embedded default — it shares state through Redis, or listens beyond loopback
    (``host``: its listen address, None when it listens nowhere) — or None when it is inside it."""
    if redis_url:
        return "with GEARSHIFT_REDIS_URL set (shared mode)"
    if host is not None and not _is_loopback(host):
        return f"when listening on {host!r}, beyond loopback"
    return None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name (or "" for every interface)


PLACEHOLDERS: frozenset[str] = frozenset({"replace-me", "change-me", "changeme", "secret", "password", ""})
"""Values that are never a real secret: the placeholders of ``secrets.env.example`` and the like (lower-cased)."""


def is_placeholder(value: str) -> bool:
    return value.strip().lower() in PLACEHOLDERS


def refuse_dev_secrets(secrets: Mapping[str, SecretStr], *, exposed: str | None, allowed: bool) -> None:
    """Raise ``ConfigError`` naming each ``GEARSHIFT_*`` variable of ``secrets`` (setting → value) still at its
    development default or at a placeholder (``PLACEHOLDERS``, such as ``replace-me``), when the process is
    ``exposed`` (``exposure``'s reason). ``allowed`` (``GEARSHIFT_ALLOW_DEV_SECRETS=1``) lets development defaults
    pass, never a placeholder."""
    if exposed is None:
        return
    placeholders = [f"GEARSHIFT_{n.upper()}" for n, v in secrets.items() if is_placeholder(v.get_secret_value())]
    if placeholders:
        raise ConfigError(
            f"{', '.join(placeholders)}: a placeholder is refused {exposed}; fill in a secret (for example "
            "`openssl rand -hex 32`)"
        )
    if allowed:
        return
    weak = [
        f"GEARSHIFT_{name.upper()}"
        for name, value in secrets.items()
        if value.get_secret_value() == DEV_SECRETS.get(name)
    ]
    if weak:
        raise ConfigError(
            f"{', '.join(weak)}: the development value is refused {exposed}; set a secret (deploy/compose: "
            "scripts/compose-env.sh writes them) or GEARSHIFT_ALLOW_DEV_SECRETS=1"
        )


class CommonSettings(BaseSettings):
    """Settings every gearshift process reads from ``GEARSHIFT_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="GEARSHIFT_", extra="forbid", frozen=True)

    fleet_file: Path | None = None
    """Fleet YAML; None uses the embedded default fleet."""
    tenants_file: Path | None = None
    """Tenants YAML; None uses the embedded default tenants."""
    redis_url: str | None = None
    """Redis for shared state; None keeps state in process memory (the embedded, single-process mode). With
    ``redis_cluster``, any node of the Redis Cluster."""
    redis_cluster: bool = False
    """``GEARSHIFT_REDIS_URL`` is a Redis Cluster node: use the cluster client (checked against the server at start)."""
    redis_sentinels: str | None = None
    """Redis Sentinel (a primary with replicas): the Sentinels as ``host:port,host:port``. The primary of
    ``redis_sentinel_master`` is found through them and found again after a failover; ``GEARSHIFT_REDIS_URL`` still
    names the store (its password and database apply, its host and port are not used)."""
    redis_sentinel_master: str = "gearshift"
    """The master name the Sentinels monitor (``sentinel monitor <name> …``)."""
    key_prefix: str = "gearshift:"
    redis_wait_replicas: Annotated[int, Field(ge=0)] = 0
    """A usage record counts as stored once this many replicas of its Redis master have it (``WAIT``); until then
    the gateway keeps it in its spool. 0 trusts the master's acknowledgement (a failover can lose what it had not
    replicated)."""
    key_pepper: SecretStr = SecretStr(DEV_SECRETS["key_pepper"])
    """Secret key of the API-key digests. Change it in production."""
    control_token: SecretStr = SecretStr(DEV_SECRETS["control_token"])
    """Bearer token the controller sends to the workers' speculation-control API."""
    admin_key: SecretStr = SecretStr(DEV_SECRETS["admin_key"])
    """Bearer key of the gateway's admin API."""
    allow_dev_secrets: bool = False
    """Let a process outside the embedded default start with a development secret (see ``refuse_dev_secrets``)."""
    log_level: str = "INFO"
    metrics_tenant_label: TenantLabelMode = "id"
    """What a metric's ``tenant`` label carries, in the gateway's and the controller's ``/metrics``: ``id`` (the tenant
    id) or ``hash`` (``t-`` and 16 hex digits of an HMAC keyed with ``GEARSHIFT_KEY_PEPPER``: stable, equal on every
    replica, not reversible without the pepper; ``fleet.metric_labels``). Set it alike on every process."""

    @model_validator(mode="after")
    def _no_placeholder_redis_password(self) -> Self:
        password = urlsplit(self.redis_url).password if self.redis_url else None
        if password is not None and is_placeholder(unquote(password)):
            raise ConfigError("GEARSHIFT_REDIS_URL: its password is a placeholder; fill in the Redis password")
        return self

    def tenant_labeler(self) -> TenantLabeler:
        """The ``tenant`` label of each tenant id in metrics (``metrics_tenant_label``)."""
        return TenantLabeler(self.metrics_tenant_label, pepper=self.key_pepper.get_secret_value())

    def fleet(self) -> FleetConfig:
        return load_fleet(self.fleet_file)

    def tenants(self) -> TenantsConfig:
        return load_tenants(self.tenants_file)
