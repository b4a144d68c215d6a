"""Settings of one simulated worker (``GEARSHIFT_SIM_*`` environment variables, or built by the CLI)."""

from __future__ import annotations

import functools
from typing import Annotated, Literal, Self

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleet.config import DEV_SECRETS, exposure, refuse_dev_secrets
from fleet.perf import IdleDrafterMode, Profile, load_profile


class SimWorkerSettings(BaseSettings):
    """One simulated Kimi K3 + DSpark worker: what it serves, how big it is, and how fast its clock runs."""

    model_config = SettingsConfigDict(env_prefix="GEARSHIFT_SIM_", extra="forbid", frozen=True, populate_by_name=True)

    worker_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")] = "sim-0"
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8000
    """TCP port; 0 picks a free one."""
    model: str = "kimi-k3"
    """Served model name (what clients send as ``model``)."""
    profile: str = "kimi-k3-dspark-tp16"
    """Performance profile: a name under ``fleet/profiles/`` or a path to a YAML file."""
    context_window: Annotated[int, Field(gt=1)] = 1_000_000
    """vLLM's ``max_model_len``, tokens: prompt + completion must fit."""
    max_num_seqs: Annotated[int, Field(ge=1, le=4096)] = 256
    max_num_batched_tokens: Annotated[int, Field(ge=1)] | None = None
    """Token budget per step; None uses the profile's ``chunked_prefill_tokens``."""
    kv_capacity_tokens: Annotated[int, Field(ge=16)] | None = None
    """KV cache size, tokens; None uses the profile's hardware figure."""
    scheduling: Literal["fcfs", "priority"] = "priority"
    """vLLM's ``--scheduling-policy``. Priority by default so the gateway's SLA tiers take effect; under
    ``fcfs`` a request with a non-zero ``priority`` is rejected with 400, as vLLM does."""
    method: str = "dspark"
    k_max: Annotated[int, Field(ge=1)] | None = None
    """The most draft tokens the control API may ask for; None = the profile drafter's k_max (also the cap)."""
    start_k: Annotated[int, Field(ge=0)] | None = None
    """Speculation length the worker starts with (its fallback schedule); None = the drafter's k_max."""
    seed: int = 0
    """Seeds draft acceptance and the generated text."""
    adaptive_verification: bool = False
    """DSpark adaptive verification: the engine chooses per step how many of the drafted tokens to verify (from a
    confidence head and the profiled step cost); the speculation schedule's k becomes the cap
    (``workers.sim.adaptive``). Exported as ``gearshift_worker_adaptive_verification``."""
    idle_drafter: IdleDrafterMode = IdleDrafterMode.STOCK
    """What its k = 0 steps cost with the drafter loaded: ``stock`` (vLLM's own k = 0, the drafter's pass runs)
    or ``plugin`` (the gearshift vLLM plugin's idle-drafter skip); the profile's ``k0_tax`` or ``k0_tax_plugin``."""
    enable_prefix_caching: bool = True
    """vLLM's ``--enable-prefix-caching`` (on by default in vLLM V1): requests sharing a prompt beginning reuse its
    cached KV blocks and skip their prefill (``workers.sim.prefix_cache``)."""
    enable_prompt_tokens_details: bool = True
    """vLLM's ``--enable-prompt-tokens-details``: the usage block carries ``prompt_tokens_details.cached_tokens``.
    Off by default in vLLM; on here, as gearshift's launcher turns it on for real workers, so the gateway can
    meter cached prompt tokens."""
    speedup: Annotated[float, Field(gt=0, le=10_000)] = 1.0
    """Simulated seconds per real second: 1.0 is real time; tests run faster."""
    default_workload: str | None = None
    """Acceptance class for requests that name none; None = the profile's default class."""
    default_max_tokens: Annotated[int, Field(ge=1)] = 1024
    """Completion length when a request gives no ``max_tokens``: min(this, context_window − prompt)."""
    eos_mean_tokens: Annotated[int, Field(ge=1)] | None = None
    """If set, a request without ``ignore_eos`` ends early (finish_reason "stop") at a pseudo end-of-sequence
    drawn from a geometric distribution with this mean, seeded by the request; None = run to max_tokens."""
    control_token: SecretStr = Field(
        SecretStr(DEV_SECRETS["control_token"]),
        validation_alias=AliasChoices("control_token", "GEARSHIFT_CONTROL_TOKEN"),
    )
    """Bearer token of ``PUT /gearshift/v1/speculation`` (shared with the controller: GEARSHIFT_CONTROL_TOKEN)."""
    allow_dev_secrets: bool = Field(
        False, validation_alias=AliasChoices("allow_dev_secrets", "GEARSHIFT_ALLOW_DEV_SECRETS")
    )
    """Listen beyond loopback with the development control token (GEARSHIFT_ALLOW_DEV_SECRETS)."""
    restart_falls_back: bool = False
    """A fault: every restart (``fleet.restart``) takes its ``restart_s`` and comes back in the mode it left, as a
    vLLM supervisor whose new mode did not start (``workers.vllm.supervisor``); for the controller's failed-restart
    tests and the chaos bench (``GEARSHIFT_SIM_RESTART_FALLS_BACK``)."""
    log_level: str = "INFO"

    @model_validator(mode="after")
    def _check_secrets(self) -> Self:
        """A worker reachable beyond loopback refuses the development control token."""
        exposed = exposure(redis_url=None, host=self.host)
        refuse_dev_secrets({"control_token": self.control_token}, exposed=exposed, allowed=self.allow_dev_secrets)
        return self

    @model_validator(mode="after")
    def _check_profile(self) -> Self:
        k_max = self.effective_k_max()
        if self.start_k is not None and self.start_k > k_max:
            raise ValueError(f"start_k: {self.start_k} exceeds k_max {k_max}")
        return self

    def effective_k_max(self) -> int:
        """The worker's k_max: the configured one, never above what the profile's drafter can propose."""
        drafter_k_max = self.load_profile().drafter.k_max
        return min(self.k_max, drafter_k_max) if self.k_max is not None else drafter_k_max

    def load_profile(self) -> Profile:
        return _cached_profile(self.profile)


@functools.lru_cache(maxsize=16)
def _cached_profile(name_or_path: str) -> Profile:
    """Profiles are immutable; parse each file once per process."""
    return load_profile(name_or_path)
